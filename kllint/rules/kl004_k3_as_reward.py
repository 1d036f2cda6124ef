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
from kllint.rules.base import Rule, estimate


def applies(site: KLSite) -> bool:
    return site.profile.direction is Direction.K3_REWARD and site.profile.scale > 0


def headline(site: KLSite) -> str:
    return f"{estimate(site)} used as a reward: gradient nearly zero near the reference"


def reason(site: KLSite) -> str:
    return (
        "as a detached weight on log pi its expected gradient is "
        "grad KL(pi||pi_ref) - grad KL(pi_ref||pi), nearly zero near the reference"
    )


RULE = Rule(
    code="KL004",
    name="k3-estimate-as-reward",
    summary="The k3 estimate is used as a reward (score-function weight): its expected gradient is grad KL(pi||pi_ref) - grad KL(pi_ref||pi), nearly zero near the reference.",
    applies=applies,
    headline=headline,
    reason=reason,
    fix_title="Use the k1 log-ratio as the per-token reward and credit it with a reward-to-go",
    confirms={"bandit": frozenset({"biased"}), "sequences": frozenset({"biased"})},
    claim="a biased gradient",
)
