"""The torch side of a fix's proof (imported only when torch is installed):
the harness's verdict on the rewritten term, and its forward value against
the original's on sampled sequences."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from kllint.analysis import ir
from kllint.harness import tabular
from kllint.harness.compile import Unsupported, expected_loss
from kllint.harness.confirm import confirm_site
from kllint.harness.verdict import CORRECT, KL, SCALED

SAMPLES = 32
SEEDS = (0, 1)


@dataclass
class Verdict:
    problem: str | None
    details: dict[str, Any] = field(default_factory=dict)


def _accepted(verdict: str, target: str | None, factor: float | None) -> bool:
    return verdict == CORRECT or (
        verdict == SCALED and target == KL and factor is not None and factor > 0
    )


def confirm(term: ir.Node, instance: str | None) -> Verdict:
    """Correct, or KL(pi||pi_ref) scaled by a positive constant, on the
    variable-length sequences (the general case) or on the instance that
    decides for this fix: fixed-length sequences when the loss divides by
    each sequence's length (1/|y| is a constant only there), the bandit for a
    rewrite of one action per sample. The general verdict is kept alongside."""
    c = confirm_site(term)
    details = {"verdict": c.verdict, "target": c.target, "factor": c.factor}
    if instance is None:
        if _accepted(c.verdict, c.target, c.factor):
            return Verdict(None, details)
        return Verdict(f"{c.verdict} ({c.target or c.reason or 'no target'})", details)
    decisive = c.instances.get(instance)
    if decisive is None:
        return Verdict(f"{c.verdict} ({c.reason or 'no verdict on ' + instance})", details)
    details.update(
        verdict=decisive.verdict,
        target=decisive.target,
        factor=decisive.factor,
        instance=instance,
        variable_length=c.verdict,
    )
    if _accepted(decisive.verdict, decisive.target, decisive.factor):
        return Verdict(None, details)
    return Verdict(f"{decisive.verdict} on {instance} ({decisive.target or 'no target'})", details)


def value_difference(original: ir.Node, rewritten: ir.Node) -> float | None:
    """The largest |difference| of the two terms' loss values on batches of
    sampled sequences (random policies far from the reference); None when
    the harness cannot evaluate one of them."""
    worst = 0.0
    try:
        with tabular.single_threaded():
            for seed in SEEDS:
                inst = tabular.instance(tabular.VARIABLE_LENGTH, seed)
                generator = torch.Generator().manual_seed(seed)
                rows = tabular.sample(inst, inst.policy_logits, SAMPLES, generator)
                a = expected_loss(original, inst.policy_logits, inst.reference_logits, rows)
                b = expected_loss(rewritten, inst.policy_logits, inst.reference_logits, rows)
                worst = max(worst, abs(float(a) - float(b)) / max(1.0, abs(float(a))))
    except (Unsupported, RuntimeError):
        return None
    return worst
