"""The text prefilter skips files that cannot hold a KL term, whatever their
identifiers are called, and never a helper that a KL term depends on:
helpers are parsed when a linted file calls them, whatever their text."""

from __future__ import annotations

from pathlib import Path

import pytest

from kllint.config import load_settings
from kllint.engine import lint_paths
from kllint.prefilter import POLICY_WORDS, must_analyse
from kllint.prefilter import may_hold_kl_term as may_hold_kl_site


def test_files_that_cannot_hold_a_kl_term_are_skipped() -> None:
    assert not may_hold_kl_site("import torch\nx = torch.ones(3)\n")
    assert not may_hold_kl_site(
        "class BaseModel:\n    def loss(self): ...\n"
    )  # a loss, no log-prob
    assert not may_hold_kl_site("build_pipeline_init_args = 1\n")  # 'pi' and 'init' in other words
    assert not may_hold_kl_site("scale = torch.log(scale + 1)\nn = math.log(2)\n")
    assert not may_hold_kl_site("weakly = backlog = 1\n")  # 'kl' inside words


@pytest.mark.parametrize(
    "source",
    [
        "loss = (logp - ref_logp).mean()\n",
        "kl = a - b\n",
        "# the KL penalty\n",
        "criterion = nn.KLDivLoss()\n",
        "loss = torch.log(pi / pi_ref)\n",
        "ratio = torch.log(new / old)\n",  # names with no role word (unsloth)
        "x = refLogProbs\n",
        "def score(a, b):\n    return a.log_prob(b)\n",
        # No loss anywhere: a per-token term backpropagated by a caller in another file.
        "def token_penalty(logits, ids):\n"
        "    return logits.gather(-1, ids) - torch.logsumexp(logits, -1)\n",
        "p = F.log_softmax(logits, -1)\n",
        "token_logp = -F.cross_entropy(logits, ids, reduction='none')\n",
        "old_lp = batch['old_lp']\n",
        "q = probs.log()\n",
    ],
)
def test_files_that_can_hold_a_kl_term_are_kept(source: str) -> None:
    assert may_hold_kl_site(source)


def test_the_prefilter_knows_every_role_word_of_the_analysis() -> None:
    # A log-prob named with any word the analysis reads as a role is kept.
    from kllint.analysis.roles import LOGPROB_WORDS, OLD_WORDS, REFERENCE_WORDS

    for word in LOGPROB_WORDS:
        assert may_hold_kl_site(f"x = {word}\n"), word
    for word in REFERENCE_WORDS | OLD_WORDS:
        assert may_hold_kl_site(f"x = {word}_log_probs\n"), word
        assert may_hold_kl_site(f"x = {word}_probs\n"), word
        assert set(POLICY_WORDS) >= {word}, word


def test_configured_role_patterns_analyse_every_file() -> None:
    assert not must_analyse("x = golden_scores\n")
    assert must_analyse("x = golden_scores\n", configured_roles=True)


def test_a_helper_module_the_prefilter_would_skip_is_still_followed(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    # No loss, no "KL", no log-prob named here: on its own this file is not read.
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
