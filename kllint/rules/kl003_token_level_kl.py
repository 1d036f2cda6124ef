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
from kllint.rules.base import Rule, where


def applies(site: KLSite) -> bool:
    p = site.profile
    return (
        p.direction is Direction.KL
        and p.scale > 0
        and p.credit is Credit.NONE
        and site.has_time_axis
    )


def message(site: KLSite) -> str:
    consequence = (
        "its gradient sum_t log_ratio_t * grad log pi(y_t|y_<t) drops the KL that each token causes "
        "later (sum_{s>t} log_ratio_s), a partial gradient of the sequence KL(pi||pi_ref)"
    )
    if site.score_function and not site.origin.estimate:
        # The KL is a detached weight (a reward, a penalty in the advantage).
        return (
            f"per-token {site.estimator} penalty weights only its own token's log-prob (a reward "
            f"without a reward-to-go), {where(site)}: {consequence}"
        )
    form = f"importance-weighted {site.estimator}" if site.importance_weighted else site.estimator
    return f"per-token {form} is summed over tokens as a loss, {where(site)}: {consequence}"


RULE = Rule(
    code="KL003",
    applies=applies,
    message=message,
    fix_title="Weight each token's log-prob by the reward-to-go G_t = sum_{s>=t} log_ratio_s.detach() "
    "(a reverse cumulative sum)",
)
