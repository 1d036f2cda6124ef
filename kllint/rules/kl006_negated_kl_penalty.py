"""KL006 negated-kl-penalty.

A loss is minimised. A KL term whose autograd gradient follows
``-grad KL(pi||pi_ref)`` (or ``-grad KL(pi_ref||pi)``) pushes the policy away
from the reference: the penalty was subtracted where it should be added (for
example ``loss = pg_loss - beta * kl``, or a KL reward added to the rewards).
Only losses that are certainly minimised count: values passed to
``.backward()`` or returned by a loss function.
"""

from __future__ import annotations

from kllint.analysis.gradient import Direction
from kllint.analysis.sites import KLSite
from kllint.rules.base import Rule, estimate


def applies(site: KLSite) -> bool:
    p = site.profile
    return site.strong_sink and p.direction in (Direction.KL, Direction.REVERSE_KL) and p.scale < 0


def _target(site: KLSite) -> str:
    return "KL(pi||pi_ref)" if site.profile.direction is Direction.KL else "KL(pi_ref||pi)"


def headline(site: KLSite) -> str:
    return f"{estimate(site, 'penalty')} negated in a minimised loss: increases {_target(site)}"


def reason(site: KLSite) -> str:
    return (
        f"its expected gradient is -grad {_target(site)}, so each step increases the KL "
        "to the reference"
    )


RULE = Rule(
    code="KL006",
    name="negated-kl-penalty",
    summary="A KL penalty enters a minimised loss with a negative sign (or a KL reward is added): gradient descent increases KL(pi||pi_ref).",
    applies=applies,
    headline=headline,
    reason=reason,
    fix_title="Add the KL penalty to the loss (`loss = pg_loss + beta * kl`), or subtract it from the rewards",
    # A negated k3 is measured as a negative multiple of the gradient of
    # KL(pi_ref||pi): "negated" too; KL002 reports its direction.
    confirms={"bandit": frozenset({"negated"}), "sequences": frozenset({"negated"})},
    claim="a negated KL gradient",
)
