"""KL004 k3-estimate-as-reward.

Used as a reward, the k3 value weights the score: ``sg(k3) * grad logp``. Its
expectation is ``E[(exp(-x) + x - 1) grad logp] = grad KL(pi||pi_ref) -
grad KL(pi_ref||pi)``, which vanishes to first order near the reference: the
penalty barely acts. k1 (the log-ratio) is the reward that gives the right
gradient.
"""

from __future__ import annotations

from kllint.analysis.gradient import Direction
from kllint.analysis.sites import KLSite
from kllint.rules.base import Rule, estimate, where


def applies(site: KLSite) -> bool:
    return site.profile.direction is Direction.K3_REWARD and site.profile.scale > 0


def message(site: KLSite) -> str:
    return (
        f"{estimate(site)} is used as a reward (a detached weight on log pi), {where(site)}: "
        "its expected gradient is grad KL(pi||pi_ref) - grad KL(pi_ref||pi), nearly zero near the reference"
    )


RULE = Rule(
    code="KL004",
    applies=applies,
    message=message,
    fix_title="Use the k1 log-ratio as the per-token reward and credit it with a reward-to-go",
)
