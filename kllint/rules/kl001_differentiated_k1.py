"""KL001 differentiated-k1-estimate.

The k1 estimate ``log_ratio = logp - ref`` is unbiased for the value of
KL(pi||pi_ref), but autograd differentiates only its integrand:
``grad log_ratio = grad logp``, and ``E_pi[grad logp] = 0``. The regulariser
contributes noise and no pull towards the reference.
"""

from __future__ import annotations

from kllint.analysis.gradient import Credit, Direction
from kllint.analysis.roles import names_a_teacher
from kllint.analysis.sites import KLSite, length_normalised
from kllint.rules.base import Rule, estimate


def applies(site: KLSite) -> bool:
    return (
        site.profile.direction is Direction.ZERO
        and site.profile.credit in (Credit.NONE,)
        and not _teacher_likelihood(site)
    )


def _teacher_likelihood(site: KLSite) -> bool:
    """``teacher_lp - student_lp`` minimised: the forward KL's k1, written for
    the teacher's samples (sequence-level distillation on its outputs), where
    it is the student's negative log-likelihood and its gradient exact. Only
    on the student's own samples is its expected gradient zero, and then the
    KL would be written student first."""
    return site.profile.scale < 0 and any(names_a_teacher(n) for n in site.reference_names)


def headline(site: KLSite) -> str:
    if length_normalised(site.term):
        return f"{estimate(site)} differentiated as a loss, per sequence length: no KL gradient"
    return f"{estimate(site)} differentiated as a loss: zero expected gradient"


def reason(site: KLSite) -> str:
    if length_normalised(site.term):
        # E[grad log pi(y) / |y|] is not 0 on variable lengths: a length reward.
        return (
            "autograd gives grad log pi divided by each sequence's length, which does not "
            "regularise towards the reference and, on variable lengths, rewards or penalises "
            "length instead"
        )
    return (
        "autograd gives grad log pi, and E_pi[grad log pi] = 0, so the KL term has zero expected "
        "gradient and does not regularise"
    )


RULE = Rule(
    code="KL001",
    name="differentiated-k1-estimate",
    summary="The k1 estimate log pi - log pi_ref is differentiated as a loss: its expected gradient is zero.",
    applies=applies,
    headline=headline,
    reason=reason,
    fix_title="Use k2 `0.5 * log_ratio**2` summed with a reward-to-go, or the score function "
    "`reverse_cumsum(log_ratio.detach()) * logp`",
    confirms={"bandit": frozenset({"zero-gradient"}), "sequences": frozenset({"zero-gradient"})},
    claim="zero expected gradient",
)
