"""KL001 differentiated-k1-estimate.

The k1 estimate ``log_ratio = logp - ref`` is unbiased for the value of
KL(pi||pi_ref), but autograd differentiates only its integrand:
``grad log_ratio = grad logp``, and ``E_pi[grad logp] = 0``. The regulariser
contributes noise and no pull towards the reference.
"""

from __future__ import annotations

from kllint.analysis.gradient import Credit, Direction
from kllint.analysis.sites import KLSite
from kllint.rules.base import Rule, estimate, where


def applies(site: KLSite) -> bool:
    return site.profile.direction is Direction.ZERO and site.profile.credit in (Credit.NONE,)


def message(site: KLSite) -> str:
    return (
        f"{estimate(site)} of KL(pi||pi_ref) is differentiated as a loss, {where(site)}: "
        "autograd gives grad log pi, and E_pi[grad log pi] = 0, so the KL term has zero expected "
        "gradient and does not regularise"
    )


RULE = Rule(
    code="KL001",
    applies=applies,
    message=message,
    fix_title="Use k2 `0.5 * log_ratio**2` summed with a reward-to-go, or the score function "
    "`reverse_cumsum(log_ratio.detach()) * logp`",
)
