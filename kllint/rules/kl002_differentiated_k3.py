"""KL002 differentiated-k3-estimate.

The k3 / ``low_var_kl`` estimate ``exp(-log_ratio) + log_ratio - 1`` is an
unbiased, low-variance estimate of the value of KL(pi||pi_ref); its autograd
gradient is ``(1 - exp(-log_ratio)) grad logp``, whose expectation under pi is
``sum_y (pi - pi_ref) grad log pi = grad KL(pi_ref||pi)``: the divergence
with its arguments swapped.
"""

from __future__ import annotations

from kllint.analysis.gradient import Direction
from kllint.analysis.sites import KLSite
from kllint.rules.base import Rule, estimate


def applies(site: KLSite) -> bool:
    p = site.profile
    # A negated k3 has two defects: fixing the sign (KL006) leaves the direction wrong.
    return (p.direction is Direction.REVERSE_KL and p.scale != 0) or p.sequence_reverse_kl


def headline(site: KLSite) -> str:
    target = "sequence KL(pi_ref||pi)" if site.profile.sequence_reverse_kl else "KL(pi_ref||pi)"
    return f"{estimate(site)} differentiated as a loss: gradient of {target}"


def reason(site: KLSite) -> str:
    p = site.profile
    if p.sequence_reverse_kl:
        return (
            "applied to the sequence log-ratio it gives (1 - exp(-sum_t log_ratio_t)) * grad log pi(y), "
            "whose expectation is grad KL(pi_ref||pi) of the sequence, not grad KL(pi||pi_ref)"
        )
    consequence = (
        "autograd gives (1 - exp(-log_ratio)) * grad log pi, whose expectation is "
        "grad KL(pi_ref||pi), not grad KL(pi||pi_ref)"
    )
    if site.has_time_axis and p.credit.value == "none":
        consequence += (
            "; summed over tokens it is also only the token-level part of the sequence gradient"
        )
    return consequence


RULE = Rule(
    code="KL002",
    name="differentiated-k3-estimate",
    summary="The k3 / low_var_kl estimate is differentiated as a loss: its expected gradient is that of KL(pi_ref||pi), not KL(pi||pi_ref).",
    applies=applies,
    headline=headline,
    reason=reason,
    fix_title="Differentiate k2 `0.5 * log_ratio**2` of the sequence, or use the score function "
    "`reverse_cumsum(log_ratio.detach()) * logp` and keep k3 for logging",
    confirms={
        "bandit": frozenset({"wrong-direction"}),
        "sequences": frozenset({"wrong-direction", "partial-wrong-direction"}),
    },
    claim="the gradient of KL(pi_ref||pi)",
)
