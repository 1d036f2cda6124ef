"""Confirm a KL site numerically: its exact expected gradient on tabular
policies, compared with the exact gradients of the divergences (docs/maths.md,
"How the claims are checked")."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import torch

from kllint.analysis import ir
from kllint.analysis.ir import Role
from kllint.analysis.roles import DISCOUNT_WORDS, words
from kllint.findings import Finding
from kllint.harness import tabular
from kllint.harness.claims import (
    CONFIRMED,
    CONTRADICTED,
    Claim,
    batch_nonlinear,
    check,
    claim_for,
    clamped,
    length_normalised,
)
from kllint.harness.claims import UNCONFIRMED as NOT_EVALUATED
from kllint.harness.compile import (
    COEFFICIENT_RANGE,
    Batches,
    Unsupported,
    batch_size_coefficients,
    check_supported,
    expected_gradient,
    finite_batches,
    nonlinear_coefficients,
)
from kllint.harness.prepare import prepare
from kllint.harness.tabular import Rows
from kllint.harness.verdict import (
    BIASED,
    MATCH_TOLERANCE,
    SCALED,
    TARGET_VERDICT,
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
# Batch sizes a term whose batch statistics enter nonlinearly is evaluated
# at, exactly (every batch enumerated), besides the large-batch limit.
BATCH_SIZES = (2,)
# The instances a finite batch size is evaluated on (N ** B batches each).
BATCHED = (tabular.SEQUENCES, tabular.VARIABLE_LENGTH)


def confirm_site(
    site_or_term: Any, seeds: tuple[int, ...] = SEEDS, claim: Claim | None = None
) -> Confirmation:
    """The verdict on a KL site (anything with an IR ``term``) or on an IR term,
    in every regime, checked against ``claim`` when one is given.

    The term is evaluated exactly on one action, fixed-length and
    variable-length sequences, far from and near the reference, off-policy
    when it has a behaviour policy, at each seed; every seed must agree.
    A coefficient inside a nonlinearity is evaluated at several values, and
    a batch statistic that enters nonlinearly at finite batch sizes.
    """
    start = time.perf_counter()
    term = getattr(site_or_term, "term", site_or_term)
    branch = str(getattr(site_or_term, "branch", "") or "")
    if not isinstance(term, ir.Node):
        return unconfirmed(f"not a KL expression: {type(site_or_term).__name__}")
    text = ir.render(term)
    term, bound, bound_names = prepare(term)

    def stop(reason: str) -> Confirmation:
        return replace(
            unconfirmed(reason, text, time.perf_counter() - start),
            outcome=None if claim is None else NOT_EVALUATED,
            claim=None if claim is None else claim.statement,
            branch=branch,
        )

    try:
        coefficients = check_supported(term)
        variants = _variants(term)
        sizes = batch_size_coefficients(term)
        regimes = [
            r
            for r in tabular.INSTANCES
            if r != tabular.OFF_POLICY or term.has_role(ir.Role.OLD_LOGP)
        ]
        instances: dict[str, InstanceResult] = {}
        with tabular.single_threaded():
            # With the batch size in the term there is no large-batch limit
            # to take: only finite batches are evaluated.
            for variant, settings in variants if not sizes else []:
                for regime in regimes:
                    name = regime if not variant else f"{regime}@{variant}"
                    instances[name] = _confirm_instance(term, regime, seeds, name, **settings)
            if sizes or batch_nonlinear(term):
                for regime in BATCHED:
                    for size in BATCH_SIZES:
                        name = f"{regime}@B={size}"
                        instances[name] = _confirm_instance(
                            term,
                            regime,
                            seeds,
                            name,
                            coefficients=dict.fromkeys(sizes, float(size)),
                            batch_size=size,
                        )
    except Unsupported as exc:
        return stop(str(exc))
    except RuntimeError as exc:  # a shape torch refuses: report, never crash the linter
        return stop(f"torch could not evaluate the term: {exc}")
    notes = list(bound)
    fixed = sorted(coefficients - bound_names - set(nonlinear_coefficients(term)) - set(sizes))
    if sizes:
        notes.append(f"{', '.join(sizes)}: the batch size")
    if fixed:
        notes.append(f"{', '.join(fixed)} set to 1: a positive factor of the whole term")
    for result in instances.values():
        if result.verdict == UNCONFIRMED:
            return replace(stop(f"{result.label}: {result.reason}"), instances=instances)
    main = _main_instance(instances)
    if claim is not None and clamped(term) and tabular.VARIABLE_LENGTH_NEAR in instances:
        # A clamp (verl's k3 at +-10) bites far from the reference only: the
        # estimator is told near it, where runs spend their steps.
        main = tabular.VARIABLE_LENGTH_NEAR
    if claim is not None and instances[main].verdict == BIASED and length_normalised(term):
        # Biased on variable lengths by the 1/|y| weights, as claimed: the
        # estimator itself is told by fixed lengths.
        main = main.replace(tabular.VARIABLE_LENGTH, tabular.SEQUENCES, 1)
    overall = instances[main]
    outcome: str | None = None
    contradictions: tuple[str, ...] = ()
    if claim is not None:
        measured = {name: _up_to_scale(r) for name, r in instances.items()}
        outcome, wrong = check(claim, measured)
        contradictions = tuple(wrong)
    return Confirmation(
        overall.verdict,
        target=overall.target,
        factor=overall.factor,
        term=text,
        instances=instances,
        seeds=seeds,
        notes=tuple(notes),
        seconds=time.perf_counter() - start,
        main=main,
        outcome=outcome,
        claim=None if claim is None else claim.statement,
        contradictions=contradictions,
        branch=branch,
    )


def _variants(term: ir.Node) -> list[tuple[str, dict[str, Any]]]:
    """``[("", {})]``, or one variant per value of the range for the
    coefficients that enter nonlinearly (all set to the same value)."""
    sizes = batch_size_coefficients(term)
    nonlinear = [n for n in nonlinear_coefficients(term) if n not in sizes]
    # A weight the settings set to 0 for another summand (``length_penalty_weight:
    # 0.0`` beside the KL reward) is held there: the term the run computes.
    off = {
        a.name: 0.0
        for a in term.atoms()
        if a.role is Role.COEFFICIENT
        and a.default is not None
        and a.default[0] == 0
        and a.name in nonlinear
    }
    # So is a discount the settings give (``gamma: float = 1.0``): a loop of
    # returns is read as the reward-to-go it is at that value, not at others.
    off.update(
        {
            a.name: a.default[0]
            for a in term.atoms()
            if a.role is Role.COEFFICIENT
            and a.default is not None
            and a.name in nonlinear
            and set(words(a.name)) & DISCOUNT_WORDS
        }
    )
    names = [n for n in nonlinear if n not in off]
    held = "".join(f",{n}={value:g} (its default)" for n, value in off.items())
    if not names:
        return [(held[1:], {"coefficients": off})] if off else [("", {})]
    return [
        (
            ",".join(f"{n}={value:g}" for n in names) + held,
            {"coefficients": {**dict.fromkeys(names, value), **off}},
        )
        for value in COEFFICIENT_RANGE
    ]


def _main_instance(instances: dict[str, InstanceResult]) -> str:
    """The instance the headline reports: variable length far from the
    reference, at the largest finite batch size when batches matter, at the
    middle coefficient value when one enters nonlinearly."""
    candidates = [n for n in instances if n.split("@")[0] == tabular.VARIABLE_LENGTH]
    batched = [n for n in candidates if "@B=" in n]
    if batched:
        return batched[-1]
    return candidates[len(candidates) // 2]


def _up_to_scale(r: InstanceResult) -> str:
    if r.verdict == SCALED and r.target is not None and r.factor is not None and r.factor > 0:
        return TARGET_VERDICT[r.target]
    return r.verdict


def confirm_findings(findings: Iterable[Finding]) -> None:
    """Set ``finding.confirmation`` to a JSON-serialisable verdict for each
    finding, checked against its rule's claim; one without a KL site is
    ``unconfirmed``. Every distinct term on the branches that reach the
    finding is confirmed; the finding is ``contradicted`` if one of them is,
    else ``confirmed`` if one of them is. Terms are confirmed once."""
    done: dict[tuple[str, object], Confirmation] = {}

    def confirmed(code: str, site: Any) -> Confirmation:
        key = (code, ir.structure(site.term))
        if key not in done:
            done[key] = confirm_site(site, claim=claim_for(code, site.term))
        return done[key]

    for finding in findings:
        site = finding.site
        if site is None:
            finding.confirmation = unconfirmed(
                "the finding carries no KL expression to evaluate"
            ).to_dict()
            continue
        cases: list[Confirmation] = []
        for s in (site, *finding.alternatives):
            case = confirmed(finding.code, s)
            if all(case is not c for c in cases):
                cases.append(replace(case, branch=str(s.branch or "")) if s is not site else case)
        # The headline: a contradiction first, then a confirmation.
        rank = {CONTRADICTED: 0, CONFIRMED: 1}
        ordered = sorted(cases, key=lambda c: rank.get(c.outcome or "", 2))
        main = ordered[0]
        if len(ordered) > 1:
            main = replace(main, alternatives=tuple(ordered[1:]))
        finding.confirmation = main.to_dict()


def _confirm_instance(
    term: ir.Node,
    regime: str,
    seeds: tuple[int, ...],
    name: str,
    coefficients: dict[str, float] | None = None,
    batch_size: int | None = None,
) -> InstanceResult:
    results = []
    description = ""
    for seed in seeds:
        inst = tabular.instance(regime, seed)
        description = inst.description
        exact = tabular.cached_targets(regime, seed)
        rows: Rows | Batches = tabular.cached_rows(regime, seed)
        if batch_size is not None:
            assert isinstance(rows, Rows)
            rows = finite_batches(rows, batch_size)
            description += f", batches of {batch_size} enumerated"
        grad, value = expected_gradient(
            term,
            inst.policy_logits,
            inst.reference_logits,
            rows,
            behaviour_logits=inst.behaviour_logits,
            coefficients=coefficients,
        )
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
    """Cosine, best factor and relative errors of ``grad`` against each target
    (all targets at once: a confirmation measures 18 gradients against 4)."""
    names = list(targets)
    basis = torch.stack([targets[n] for n in names])  # [k, D]
    norms = basis.norm(dim=1)
    dots = basis @ grad
    factors = dots / (norms * norms)
    scaled_norms = factors.abs() * norms
    residuals = (grad.unsqueeze(0) - factors.unsqueeze(1) * basis).norm(dim=1)
    unscaled = (grad.unsqueeze(0) - basis).norm(dim=1) / norms
    grad_norm = float(grad.norm())
    rows = zip(
        names,
        norms.tolist(),
        dots.tolist(),
        factors.tolist(),
        scaled_norms.tolist(),
        residuals.tolist(),
        unscaled.tolist(),
        strict=True,
    )
    return {
        name: TargetMetrics(
            norm=norm,
            cosine=None if grad_norm == 0 else dot / (grad_norm * norm),
            factor=factor,
            rel_err=residual / scaled_norm if scaled_norm > 0 else float("inf"),
            rel_err_unscaled=rel_unscaled,
        )
        for name, norm, dot, factor, scaled_norm, residual, rel_unscaled in rows
    }


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
