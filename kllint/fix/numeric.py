"""The torch side of a fix's proof (imported only when torch is installed):
the harness's verdict on the rewritten term, and its forward value against
the original's on sampled sequences."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from kllint.analysis import ir
from kllint.analysis.ir import Role
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


def representable(term: ir.Node) -> tuple[ir.Node, list[str]]:
    """The term with the values the IR could not represent (``data["mask"]``,
    ``len(batch) / mini_batch_size``) lowered for the harness: a factor of a
    reduced product or a reduced value on its own is the mask (the tokens a
    loss sums over), any other one a positive scale, set to 1 as coefficients
    are. The original and the rewritten term get the same lowering, so the
    comparison of their values and the verdict on the rewrite still hold."""
    mapping: dict[int, ir.Node] = {}
    masks: set[int] = set()

    def factors(node: ir.Node) -> None:
        if isinstance(node, ir.Opaque):
            masks.add(id(node))
        elif isinstance(node, ir.Binary) and node.op == "mul":
            factors(node.left)
            factors(node.right)

    for node in term.walk():
        if isinstance(node, ir.Reduce):
            factors(node.arg)
            if node.mask is not None:
                factors(node.mask)
    notes = []
    for node in term.walk():
        if isinstance(node, ir.Opaque) and id(node) not in mapping:
            if id(node) in masks:
                mapping[id(node)] = ir.Atom(Role.MASK, "mask")
                notes.append(f"{node.reason}: evaluated as the mask")
            else:
                mapping[id(node)] = ir.Const(1.0)
                notes.append(f"{node.reason}: set to 1")
    return (ir.substitute(term, mapping) if mapping else term), sorted(set(notes))


def confirm(term: ir.Node, instance: str | None) -> Verdict:
    """Correct, or KL(pi||pi_ref) scaled by a positive constant, on the
    variable-length sequences (the general case) or on the instance that
    decides for this fix: fixed-length sequences when the loss divides by
    each sequence's length (1/|y| is a constant only there), the bandit for a
    rewrite of one action per sample. The general verdict is kept alongside."""
    term, notes = representable(term)
    c = confirm_site(term)
    details: dict[str, Any] = {"verdict": c.verdict, "target": c.target, "factor": c.factor}
    if notes:
        details["notes"] = notes
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
    original, rewritten = representable(original)[0], representable(rewritten)[0]
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
