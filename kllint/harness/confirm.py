"""Confirm a KL site numerically: its exact expected gradient on tabular
policies, compared with the exact gradients of the divergences (docs/maths.md,
"How the claims are checked")."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import torch

from kllint.analysis import ir
from kllint.findings import Finding
from kllint.harness import tabular
from kllint.harness.compile import Unsupported, check_supported, expected_gradient
from kllint.harness.verdict import (
    BIASED,
    MATCH_TOLERANCE,
    UNCONFIRMED,
    Confirmation,
    InstanceResult,
    SeedResult,
    TargetMetrics,
    aggregate,
    classify,
    unconfirmed,
)

SEEDS = (0, 1, 2)


def confirm_site(site_or_term: Any, seeds: tuple[int, ...] = SEEDS) -> Confirmation:
    """The verdict on a KL site (anything with an IR ``term``) or on an IR term.

    The term is evaluated exactly on a bandit, fixed-length sequences and
    variable-length sequences, at each seed; every seed must agree.
    """
    start = time.perf_counter()
    term = getattr(site_or_term, "term", site_or_term)
    if not isinstance(term, ir.Node):
        return unconfirmed(f"not an IR term: {type(site_or_term).__name__}")
    text = ir.render(term)
    try:
        coefficients = check_supported(term)
        with tabular.single_threaded():
            instances = {name: _confirm_instance(term, name, seeds) for name in tabular.INSTANCES}
    except Unsupported as exc:
        return unconfirmed(str(exc), text, time.perf_counter() - start)
    except RuntimeError as exc:  # a shape torch refuses: report, never crash the linter
        return unconfirmed(
            f"torch could not evaluate the term: {exc}", text, time.perf_counter() - start
        )
    notes = []
    if coefficients:
        names = ", ".join(sorted(coefficients))
        notes.append(f"coefficients set to 1: {names}")
    for result in instances.values():
        if result.verdict == UNCONFIRMED:
            return Confirmation(
                UNCONFIRMED,
                reason=f"{result.label}: {result.reason}",
                term=text,
                instances=instances,
                seeds=seeds,
                notes=tuple(notes),
                seconds=time.perf_counter() - start,
            )
    # The general case of sequence-level training code decides.
    overall = instances[tabular.VARIABLE_LENGTH]
    return Confirmation(
        overall.verdict,
        target=overall.target,
        factor=overall.factor,
        term=text,
        instances=instances,
        seeds=seeds,
        notes=tuple(notes),
        seconds=time.perf_counter() - start,
    )


def confirm_findings(findings: Iterable[Finding]) -> None:
    """Set ``finding.confirmation`` to a JSON-serialisable verdict for each
    finding; one without a KL site is ``unconfirmed``. Findings sharing a
    term are confirmed once."""
    done: dict[int, dict[str, Any]] = {}
    for finding in findings:
        site = finding.site
        if site is None:
            finding.confirmation = unconfirmed(
                "the finding carries no KL site to evaluate"
            ).to_dict()
            continue
        key = id(site.term)
        if key not in done:
            done[key] = confirm_site(site).to_dict()
        finding.confirmation = done[key]


def _confirm_instance(term: ir.Node, name: str, seeds: tuple[int, ...]) -> InstanceResult:
    results = []
    description = ""
    for seed in seeds:
        inst = tabular.instance(name, seed)
        description = inst.description
        exact = tabular.cached_targets(name, seed)
        rows = tabular.enumerated(inst, inst.policy_logits)
        grad, value = expected_gradient(term, inst.policy_logits, inst.reference_logits, rows)
        metrics = measure(grad, exact.gradients)
        verdict, target, factor = classify(float(grad.norm()), metrics)
        combination = decompose(grad, exact.gradients) if verdict == BIASED else None
        results.append(
            SeedResult(
                seed=seed,
                verdict=verdict,
                target=target,
                factor=factor,
                grad_norm=float(grad.norm()),
                expected_value=value,
                kl=exact.kl,
                reverse_kl=exact.reverse_kl,
                targets=metrics,
                combination=combination,
            )
        )
    return aggregate(name, description, results)


def measure(grad: torch.Tensor, targets: dict[str, torch.Tensor]) -> dict[str, TargetMetrics]:
    """Cosine, best factor and relative errors of ``grad`` against each target."""
    out = {}
    grad_norm = grad.norm()
    for name, t in targets.items():
        norm = t.norm()
        dot = grad @ t
        factor = dot / (norm * norm)
        scaled = factor * t
        scaled_norm = scaled.norm()
        out[name] = TargetMetrics(
            norm=float(norm),
            cosine=None if grad_norm == 0 else float(dot / (grad_norm * norm)),
            factor=float(factor),
            rel_err=float((grad - scaled).norm() / scaled_norm)
            if scaled_norm > 0
            else float("inf"),
            rel_err_unscaled=float((grad - t).norm() / norm),
        )
    return out


def decompose(grad: torch.Tensor, targets: dict[str, torch.Tensor]) -> dict[str, float] | None:
    """``E[grad] = sum_i c_i t_i`` exactly (relative residual below the match
    tolerance), with the negligible ``c_i`` dropped; None when no combination
    fits. The targets are linearly independent (hundreds of coordinates, at
    most four targets), so a fit is evidence, not an accident."""
    names = list(targets)
    basis = torch.stack([targets[n] for n in names], dim=1)
    solution = torch.linalg.lstsq(basis, grad.unsqueeze(1)).solution.squeeze(1)
    residual = (basis @ solution - grad).norm() / grad.norm()
    if not residual <= MATCH_TOLERANCE:
        return None
    largest = float(solution.abs().max())
    return {
        n: float(c)
        for n, c in zip(names, solution, strict=True)
        if abs(float(c)) > MATCH_TOLERANCE * largest
    }
