"""A finding reads as one short headline in the code's own names; the
reasoning, the resolved selector, the sink and the helper are its notes."""

from __future__ import annotations

from pathlib import Path

from corpus import findings_of

from kllint.analysis.project import Project
from kllint.analysis.roles import RolePatterns
from kllint.driver import check_source
from kllint.findings import Finding

FIXTURES = Path(__file__).parent / "fixtures"


def findings(relative: str) -> list[Finding]:
    return findings_of(FIXTURES / relative)


def test_headline_names_the_estimate_and_what_is_wrong() -> None:
    k3 = next(f for f in findings("corpus/helpers_dispatch.py") if f.line == 69)
    assert k3.code == "KL002"
    assert k3.message == (
        "k3 estimate `logprobs`/`ref_logprobs` differentiated as a loss: gradient of KL(pi_ref||pi)"
    )


def test_the_reasoning_sink_and_helper_are_notes() -> None:
    k3 = next(f for f in findings("corpus/helpers_dispatch.py") if f.line == 69)
    assert k3.notes[0].startswith("autograd gives (1 - exp(-log_ratio)) * grad log pi")
    assert "reaches the loss through the value returned by `loss_literal_low_var_kl`" in k3.notes
    assert any(n.startswith("computed in `kl_estimate` (") for n in k3.notes)


def test_a_selector_resolved_from_a_config_default_is_a_note() -> None:
    k3 = next(f for f in findings("corpus/helpers_dispatch.py") if f.line == 117)
    assert "kind = 'k3' (default from `TrainerConfig` (helpers_dispatch.py:110))" in k3.notes
    assert k3.facts["resolved"] == [
        "kind = 'k3' (default from `TrainerConfig` (helpers_dispatch.py:110))"
    ]


def test_a_method_is_named_at_its_own_class_def() -> None:
    # ``KLLowVar.estimate``, not the abstract ``KLEstimator.estimate`` above it.
    k3 = next(f for f in findings("heldout135/e01_verl_abc_registry_low_var_kl.py") if f.line == 97)
    assert any(n.startswith("computed in `estimate` (") and n.endswith(":60)") for n in k3.notes)


def test_an_unresolved_selector_gives_one_finding_naming_the_other_branches(
    tmp_path: Path,
) -> None:
    # `kl_type` comes from the caller: k1 and k3 are both reachable on one line.
    source = """\
import torch


def kl_term(logp, ref_logp, kl_type):
    log_ratio = logp - ref_logp
    if kl_type == "k1":
        kl = log_ratio
    else:
        kl = torch.exp(-log_ratio) + log_ratio - 1
    return kl


def compute_loss(logp, ref_logp, mask, kl_type):
    kl = kl_term(logp, ref_logp, kl_type)
    return (kl * mask).sum(-1).mean()
"""
    path = tmp_path / "loss.py"
    path.write_text(source)
    found = check_source(source, str(path), Project([tmp_path]), RolePatterns())
    assert [f.code for f in found] == ["KL001"]
    (k1,) = found
    assert any(n.startswith('when not (kl_type == "k1"): KL002 k3 estimate') for n in k1.notes)
    assert k1.facts["other_branches"][0]["code"] == "KL002"


def test_two_defects_on_one_branch_stay_two_findings() -> None:
    found = [f for f in findings("heldout4/tinyzero_actor.py") if f.line == 76]
    assert sorted(f.code for f in found) == ["KL002", "KL006"]
