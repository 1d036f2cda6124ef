"""The text prefilter skips files that cannot hold a KL site, and never a
helper that a KL site depends on: helpers are parsed when a linted file calls
them, whatever their text."""

from __future__ import annotations

from pathlib import Path

from kllint.config import load_settings
from kllint.driver import may_hold_kl_site
from kllint.engine import lint_paths


def test_files_without_a_loss_or_a_reference_log_prob_are_skipped() -> None:
    assert not may_hold_kl_site("import torch\nx = torch.ones(3)\n")
    assert not may_hold_kl_site(
        "class BaseModel:\n    def loss(self): ...\n"
    )  # 'base', no log-prob
    assert not may_hold_kl_site("prefix_logp = 1\nloss = prefix_logp\n")  # 'prefix' is not 'ref'
    assert may_hold_kl_site("loss = (logp - ref_logp).mean()\n")
    assert may_hold_kl_site("kl = a - b\nloss.backward()\n")
    assert may_hold_kl_site("loss = torch.log(pi / pi_ref)\n")


def test_a_helper_module_the_prefilter_would_skip_is_still_followed(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    # No loss, no "KL" here: on its own this file is only syntax-checked.
    (package / "estimates.py").write_text(
        "import torch\n\n\n"
        "def divergence(a, b, kind):\n"
        "    if kind == 'low_var':\n"
        "        return torch.exp(b - a) - (b - a) - 1\n"
        "    return a - b\n"
    )
    (package / "train.py").write_text(
        "from pkg.estimates import divergence\n\n\n"
        "def step(logprobs, ref_logprobs, mask):\n"
        "    penalty = divergence(logprobs, ref_logprobs, 'low_var')\n"
        "    loss = (penalty * mask).sum(-1).mean()\n"
        "    loss.backward()\n"
    )
    result = lint_paths([package], load_settings([package]), jobs=1)
    assert [(Path(f.path).name, f.line, f.code) for f in result.findings] == [
        ("train.py", 5, "KL002")
    ]
