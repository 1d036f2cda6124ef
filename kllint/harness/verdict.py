"""Verdicts: how an exact expected gradient compares with the target gradients.

Torch-free: the numbers come from :mod:`kllint.harness.confirm`, the decision
and its wording live here.

Thresholds, justified by measurement (``tests/test_harness.py`` re-measures
them). Over every estimator of the table, the three instances and three seeds:

* an estimator that equals a target agrees with it to a relative error of at
  most 1.5e-15 (float64 rounding), and k1's expected gradient has norm
  2.4e-16 of the largest target's;
* distinct targets are far apart, ``||t1 - c t2|| / ||c t2||`` at the best
  factor ``c``: bandit 0.79 to 1.05; fixed-length sequences 0.171 (grad
  KL(pi||pi_ref) against its token-level partial, seed 2) to 1.67;
  variable length 0.213 to 1.08;
* the closest a biased estimator comes to any target is 0.23 (ratio *
  clamped k3, variable length).

A match tolerance of 1e-6 thus sits nine orders of magnitude above rounding
and five below the nearest wrong answer: no verdict is near its threshold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from kllint.harness.regimes import label as regime_label

KL = "KL(pi||pi_ref)"
REVERSE_KL = "KL(pi_ref||pi)"
PARTIAL_KL = "partial KL(pi||pi_ref)"
PARTIAL_REVERSE_KL = "partial KL(pi_ref||pi)"
TARGETS = (KL, REVERSE_KL, PARTIAL_KL, PARTIAL_REVERSE_KL)  # also the order of preference

ZERO_GRADIENT = "zero-gradient"
CORRECT = "correct"
WRONG_DIRECTION = "wrong-direction"
PARTIAL = "partial"
PARTIAL_WRONG_DIRECTION = "partial-wrong-direction"
SCALED = "scaled"
NEGATED = "negated"
BIASED = "biased"
UNCONFIRMED = "unconfirmed"
VERDICTS = (
    ZERO_GRADIENT,
    CORRECT,
    WRONG_DIRECTION,
    PARTIAL,
    PARTIAL_WRONG_DIRECTION,
    SCALED,
    NEGATED,
    BIASED,
    UNCONFIRMED,
)

# The verdict for an exact match (factor 1) with each target.
TARGET_VERDICT = {
    KL: CORRECT,
    REVERSE_KL: WRONG_DIRECTION,
    PARTIAL_KL: PARTIAL,
    PARTIAL_REVERSE_KL: PARTIAL_WRONG_DIRECTION,
}

TARGET_LABEL = {
    KL: "grad KL(pi||pi_ref)",
    REVERSE_KL: "grad KL(pi_ref||pi)",
    PARTIAL_KL: "token-level partial grad KL(pi||pi_ref)",
    PARTIAL_REVERSE_KL: "token-level partial grad KL(pi_ref||pi)",
}

# |E[grad]| below this fraction of the largest target norm is zero: k1 gives
# ~1e-17 here (sum_y pi(y) grad log pi(y) = grad 1 = 0, up to rounding).
ZERO_TOLERANCE = 1e-9
# A target matches when ||g - c t|| / ||c t|| is below this (c the best factor).
MATCH_TOLERANCE = 1e-6
# ... and the factor counts as 1 when |c - 1| is below this.
FACTOR_TOLERANCE = 1e-6


@dataclass(frozen=True)
class TargetMetrics:
    """How the expected gradient ``g`` compares with one target ``t``."""

    norm: float  # ||t||
    cosine: float | None  # <g, t> / (||g|| ||t||); None when g = 0
    factor: float  # best scale c = <g, t> / ||t||^2
    rel_err: float  # ||g - c t|| / ||c t||: agreement up to the factor (inf when c = 0)
    rel_err_unscaled: float  # ||g - t|| / ||t||

    def to_dict(self) -> dict[str, Any]:
        return {
            "norm": self.norm,
            "cosine": self.cosine,
            "factor": self.factor,
            "rel_err": _finite(self.rel_err),
            "rel_err_unscaled": self.rel_err_unscaled,
        }


@dataclass(frozen=True)
class SeedResult:
    """One instance at one seed."""

    seed: int
    verdict: str
    target: str | None
    factor: float | None
    grad_norm: float  # ||E[grad]||
    expected_value: float  # E[term]: what the code would log
    kl: float  # KL(pi||pi_ref) of the instance, nats
    reverse_kl: float  # KL(pi_ref||pi)
    targets: dict[str, TargetMetrics]
    # E[grad] as an exact linear combination of the targets (residual below
    # MATCH_TOLERANCE), when it is one: k3 as a reward is
    # grad KL(pi||pi_ref) - grad KL(pi_ref||pi). None otherwise.
    combination: dict[str, float] | None = None

    @property
    def relative_norm(self) -> float:
        """||E[grad]|| over the largest target norm."""
        return self.grad_norm / max(m.norm for m in self.targets.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "verdict": self.verdict,
            "target": self.target,
            "factor": self.factor,
            "grad_norm": self.grad_norm,
            "relative_norm": self.relative_norm,
            "expected_value": self.expected_value,
            "kl": self.kl,
            "reverse_kl": self.reverse_kl,
            "targets": {name: m.to_dict() for name, m in self.targets.items()},
            "combination": self.combination,
        }


def classify(
    grad_norm: float, targets: dict[str, TargetMetrics]
) -> tuple[str, str | None, float | None]:
    """``(verdict, target, factor)`` for one instance at one seed."""
    largest = max(m.norm for m in targets.values())
    if grad_norm <= ZERO_TOLERANCE * largest:
        return ZERO_GRADIENT, None, 0.0
    for name in TARGETS:
        m = targets.get(name)
        if m is None or m.rel_err > MATCH_TOLERANCE:
            continue
        if abs(m.factor - 1.0) <= FACTOR_TOLERANCE:
            return TARGET_VERDICT[name], name, 1.0
        return (SCALED if m.factor > 0 else NEGATED), name, m.factor
    nearest = min(targets, key=lambda name: targets[name].rel_err)
    return BIASED, nearest, targets[nearest].factor


@dataclass(frozen=True)
class InstanceResult:
    """The verdict on one instance, which every seed must agree on."""

    name: str  # "bandit", "sequences", "variable_length"
    description: str
    verdict: str
    target: str | None
    factor: float | None  # at the first seed; see ``factors``
    reason: str | None  # why unconfirmed
    seeds: tuple[SeedResult, ...] = ()

    @property
    def label(self) -> str:
        return regime_label(self.name)

    @property
    def factors(self) -> tuple[float | None, ...]:
        return tuple(s.factor for s in self.seeds)

    @property
    def worst(self) -> SeedResult | None:
        """The seed nearest to changing the verdict: for a match, the largest
        relative error; for ``biased``, the smallest distance to the nearest
        target; for ``zero-gradient``, the largest relative norm."""
        if not self.seeds:
            return None
        if self.verdict == ZERO_GRADIENT:
            return max(self.seeds, key=lambda s: s.relative_norm)
        if self.target is None:
            return None
        target = self.target
        if self.verdict == BIASED:
            return min(self.seeds, key=lambda s: s.targets[target].rel_err)
        return max(self.seeds, key=lambda s: s.targets[target].rel_err)

    @property
    def rel_err(self) -> float | None:
        """Worst case over seeds of ``||g - c t|| / ||c t||`` for the target."""
        worst = self.worst
        if worst is None or self.target is None:
            return None
        return worst.targets[self.target].rel_err

    @property
    def combination(self) -> dict[str, float] | None:
        """The exact combination of targets, when every seed has the same one
        (a combination whose weights change with the policy is not reported)."""
        combos = [s.combination for s in self.seeds]
        first = combos[0] if combos else None
        if first is None or self.verdict != BIASED:
            return None
        for other in combos[1:]:
            if other is None or other.keys() != first.keys():
                return None
            if any(
                abs(other[k] - first[k]) > FACTOR_TOLERANCE * max(1.0, abs(first[k])) for k in first
            ):
                return None
        return first

    @property
    def distance_to_kl(self) -> float | None:
        """Smallest over seeds of ``||g - t|| / ||t||`` with t = grad KL(pi||pi_ref):
        how far the estimator is from the correct gradient, conservatively."""
        if not self.seeds:
            return None
        return min(s.targets[KL].rel_err_unscaled for s in self.seeds)

    def to_dict(self) -> dict[str, Any]:
        worst = self.worst
        return {
            "instance": self.name,
            "description": self.description,
            "verdict": self.verdict,
            "target": self.target,
            "factor": self.factor,
            "factors": list(self.factors),
            "reason": self.reason,
            "worst_seed": None if worst is None else worst.seed,
            "rel_err": _finite(self.rel_err),
            "distance_to_kl": self.distance_to_kl,
            "combination": self.combination,
            "seeds": [s.to_dict() for s in self.seeds],
        }


def aggregate(name: str, description: str, seeds: list[SeedResult]) -> InstanceResult:
    """Every seed must give the same verdict (and, unless biased, the same
    target), or nothing is confirmed. A biased term may be nearest to different
    targets at different seeds; it is reported with the seed where it comes
    closest to any target (the case nearest to a match)."""
    verdicts = {s.verdict for s in seeds}
    targets = {s.target for s in seeds}
    if len(verdicts) > 1 or (verdicts != {BIASED} and len(targets) > 1):
        detail = ", ".join(f"seed {s.seed}: {_describe(s.verdict, s.target)}" for s in seeds)
        return InstanceResult(
            name,
            description,
            UNCONFIRMED,
            None,
            None,
            f"the seeds disagree ({detail})",
            tuple(seeds),
        )
    chosen = seeds[0]
    if verdicts == {BIASED}:
        chosen = min(seeds, key=lambda s: s.targets[s.target].rel_err if s.target else math.inf)
    return InstanceResult(
        name, description, chosen.verdict, chosen.target, chosen.factor, None, tuple(seeds)
    )


@dataclass(frozen=True)
class Confirmation:
    """The harness's verdict on one KL term.

    ``verdict`` is one of :data:`VERDICTS`. ``target`` names the target the
    expected gradient matches (or, for ``biased``, the nearest one) and
    ``factor`` the scale: ``scaled`` with target KL(pi||pi_ref) and factor
    0.25 means the direction is right and the step is a quarter of it (a
    mean over 4 tokens, say). :attr:`up_to_scale` gives the verdict a term
    would get with its positive factor divided out.

    The overall verdict is the variable-length instance's (the general case of
    sequence-level training code); ``instances`` holds all three, the bandit
    telling the one-token story.
    """

    verdict: str
    target: str | None = None
    factor: float | None = None
    reason: str | None = None
    term: str = ""
    instances: dict[str, InstanceResult] = field(default_factory=dict)
    seeds: tuple[int, ...] = ()
    notes: tuple[str, ...] = ()
    seconds: float = 0.0
    main: str = "variable_length"  # the instance the headline reports
    # Against the rule's claim (kllint.harness.claims): "confirmed",
    # "contradicted" or "unconfirmed"; None when nothing was claimed.
    outcome: str | None = None
    claim: str | None = None  # the rule's claim, in words
    contradictions: tuple[str, ...] = ()
    branch: str = ""  # the branch condition this alternative is taken under
    # The other branches the same finding is reached on, each confirmed.
    alternatives: tuple[Confirmation, ...] = ()

    @property
    def up_to_scale(self) -> str:
        """The verdict with a positive factor treated as agreement: ``scaled``
        toward grad KL(pi||pi_ref) is ``correct`` up to scale."""
        if self.verdict == SCALED and self.target is not None:
            return TARGET_VERDICT[self.target]
        return self.verdict

    @property
    def overall(self) -> InstanceResult | None:
        return self.instances.get(self.main)

    def evidence(self) -> str:
        """The numbers: the main instance, then the instances that differ."""
        if self.verdict == UNCONFIRMED:
            return str(self.reason)
        main = self.overall
        assert main is not None
        text = _headline(main)
        others = [
            _short(r)
            for name, r in self.instances.items()
            if name != main.name and _differs(r, main)
        ]
        if others:
            text += "; " + "; ".join(others)
        if self.notes:
            text += " (" + "; ".join(self.notes) + ")"
        return text

    def summary(self) -> str:
        """One line: the outcome against the claim first, then the numbers;
        each other branch of the finding after it."""
        text = self._own_summary()
        shown = {text}
        for other in self.alternatives:
            own = other._own_summary()
            if own not in shown:  # branches with the same numbers are said once
                shown.add(own)
                text += f" | if {other.branch or 'otherwise'}: {own}"
        return text

    def _own_summary(self) -> str:
        if self.verdict == UNCONFIRMED:
            return f"unconfirmed: {self.reason}"
        if self.outcome is None:
            return f"{self.verdict}: {self.evidence()}"
        if self.contradictions:
            return (
                f"{self.outcome}: the rule claims {self.claim}, but "
                + "; ".join(self.contradictions)
                + f". Measured: {self.evidence()}"
            )
        return f"{self.outcome}: {self.evidence()}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable (no NaN or infinity)."""
        return {
            "outcome": self.outcome,
            "claim": self.claim,
            "contradictions": list(self.contradictions),
            "branch": self.branch or None,
            "main_instance": self.main,
            "alternatives": [a.to_dict() for a in self.alternatives],
            "verdict": self.verdict,
            "up_to_scale": self.up_to_scale,
            "target": self.target,
            "factor": self.factor,
            "reason": self.reason,
            "summary": self.summary(),
            "term": self.term,
            "seeds": list(self.seeds),
            "notes": list(self.notes),
            "seconds": self.seconds,
            "thresholds": {
                "zero": ZERO_TOLERANCE,
                "match": MATCH_TOLERANCE,
                "factor": FACTOR_TOLERANCE,
            },
            "instances": {name: r.to_dict() for name, r in self.instances.items()},
        }


def unconfirmed(reason: str, term: str = "", seconds: float = 0.0) -> Confirmation:
    return Confirmation(UNCONFIRMED, reason=reason, term=term, seconds=seconds)


def _headline(r: InstanceResult) -> str:
    if r.verdict == UNCONFIRMED:
        return f"unconfirmed: {r.reason}"
    if r.verdict == ZERO_GRADIENT:
        worst = r.worst
        ratio = 0.0 if worst is None else worst.relative_norm
        return f"E[grad] = 0 (|E[grad]| / |target| = {ratio:.0e} on {r.label}): no regularisation"
    assert r.target is not None
    label = TARGET_LABEL[r.target]
    distance = f"; {r.distance_to_kl:.2g} away from grad KL(pi||pi_ref)"
    if r.verdict == BIASED:
        worst = r.worst
        assert worst is not None
        m = worst.targets[r.target]
        cosine = "n/a" if m.cosine is None else f"{m.cosine:.2f}"
        if r.combination is not None:
            return (
                f"biased on {r.label}: E[grad] = {combination_text(r.combination)}, "
                f"no single target{distance}"
            )
        if m.rel_err >= 1 or m.factor <= 0:
            kl = worst.targets[KL]
            kl_cosine = "n/a" if kl.cosine is None else f"{kl.cosine:.2f}"
            return (
                f"biased on {r.label}: E[grad] is none of the KL gradients, nor near one "
                f"(cosine with grad KL(pi||pi_ref) {kl_cosine}){distance}"
            )
        return (
            f"biased on {r.label}: E[grad] is none of the KL gradients; the nearest, "
            f"{_scale(m.factor)}{label}, is {m.rel_err:.2g} away (cosine {cosine}){distance}"
        )
    err = f"to {r.rel_err:.0e}" if r.rel_err else "exactly"
    if r.verdict == SCALED:
        return f"E[grad] = {_scale(r.factor)}{label} {err} on {r.label}: {_factor_story(r)}"
    if r.verdict == NEGATED:
        return (
            f"E[grad] = {_scale(r.factor)}{label} {err} on {r.label}: the divergence is "
            "subtracted, so training increases it"
        )
    if r.verdict == CORRECT:
        return f"E[grad] = {label} {err} on {r.label}"
    return f"E[grad] = {label} {err} on {r.label}{distance}"


def combination_text(combination: dict[str, float]) -> str:
    """``grad KL(pi||pi_ref) - grad KL(pi_ref||pi)``, coefficients to 3 digits."""
    parts = []
    for name, c in combination.items():
        magnitude = "" if abs(abs(c) - 1.0) <= FACTOR_TOLERANCE else f"{abs(c):.3g} x "
        sign = "-" if c < 0 else "+"
        parts.append(f"{sign} {magnitude}{TARGET_LABEL[name]}")
    text = " ".join(parts)
    return text[2:] if text.startswith("+ ") else "-" + text[1:]


def _factor_story(r: InstanceResult) -> str:
    """``correct up to a positive factor``: the verdict with the scale divided out."""
    assert r.target is not None
    story = f"{TARGET_VERDICT[r.target]} up to a positive factor"
    factors = [f for f in r.factors if f is not None]
    if factors and max(factors) - min(factors) > FACTOR_TOLERANCE * max(abs(f) for f in factors):
        story += (
            f" that depends on the policy ({min(factors):.3g} to {max(factors):.3g} over the seeds)"
        )
    return story


def _differs(r: InstanceResult, main: InstanceResult) -> bool:
    """Worth a mention in the summary: another verdict, or another target or
    factor for a match (two biased instances are alike enough)."""
    if r.verdict != main.verdict:
        return True
    if r.verdict in (BIASED, ZERO_GRADIENT):
        return False
    return (r.target, _rounded(r.factor)) != (main.target, _rounded(main.factor))


def _short(r: InstanceResult) -> str:
    if r.verdict == BIASED and r.combination is not None:
        return f"{r.label}: biased ({combination_text(r.combination)})"
    return f"{r.label}: {_describe(r.verdict, r.target, r.factor)}"


def _describe(verdict: str, target: str | None, factor: float | None = None) -> str:
    if verdict in (SCALED, NEGATED) and target is not None and factor is not None:
        return f"{verdict} ({_scale(factor)}{TARGET_LABEL[target]})"
    if verdict == BIASED and target is not None:
        return f"biased (nearest {TARGET_LABEL[target]})"
    return verdict


def _scale(factor: float | None) -> str:
    if factor is None or abs(factor - 1.0) <= FACTOR_TOLERANCE:
        return ""
    return f"{factor:.3g} x "


def _rounded(factor: float | None) -> float | None:
    return None if factor is None else round(factor, 6)


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else x
