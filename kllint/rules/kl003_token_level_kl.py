"""KL003 token-level-kl-gradient.

With sequences, ``grad KL(pi||pi_ref) = E[sum_t grad log pi(y_t|y_<t) *
sum_{s>=t} log_ratio_s]``: each token is credited with the KL of everything it
causes later. A per-token term whose gradient is right for one token (k2, the
score function ``sg(log_ratio) * logp``, importance-weighted k3, a KL penalty
in a per-token reward without a return) keeps only ``s = t``: a partial
gradient of the sequence KL.
"""

from __future__ import annotations

from kllint.analysis.gradient import Credit, Direction
from kllint.analysis.sites import KLSite
from kllint.rules.base import Rule, estimate


def applies(site: KLSite) -> bool:
    p = site.profile
    return (
        p.direction is Direction.KL
        and p.scale > 0
        and p.credit is Credit.NONE
        and site.has_time_axis
    )


def _as_reward(site: KLSite) -> bool:
    """The KL is a detached weight (a reward, a penalty in the advantage)."""
    return site.score_function and not site.origin.estimate


def headline(site: KLSite) -> str:
    if _as_reward(site):
        return f"per-token {estimate(site, 'penalty')} has no reward-to-go: partial sequence KL gradient"
    weighted = "IS-weighted " if site.importance_weighted else ""
    return f"per-token {weighted}{estimate(site, '')} summed: partial sequence KL gradient"


def reason(site: KLSite) -> str:
    consequence = (
        "its gradient sum_t log_ratio_t * grad log pi(y_t|y_<t) drops the KL that each token causes "
        "later (sum_{s>t} log_ratio_s), a partial gradient of the sequence KL(pi||pi_ref)"
    )
    if _as_reward(site):
        return (
            "it weights only its own token's log-prob (a reward without a reward-to-go): "
            + consequence
        )
    return consequence


RULE = Rule(
    code="KL003",
    name="token-level-kl-gradient",
    summary="A per-token KL gradient term is summed over tokens (or a per-token KL penalty enters a policy gradient without a reward-to-go): a partial gradient of the sequence KL(pi||pi_ref).",
    applies=applies,
    headline=headline,
    reason=reason,
    fix_title="Weight each token's log-prob by the reward-to-go G_t = sum_{s>=t} log_ratio_s.detach() "
    "(a reverse cumulative sum)",
    confirms={"bandit": frozenset({"correct"}), "sequences": frozenset({"partial"})},
    claim="the token-level partial gradient of KL(pi||pi_ref)",
)
