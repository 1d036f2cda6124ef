"""KL005 kl-loss-without-gradient.

A KL term that reaches ``.backward()`` or a loss function's return value but
was computed under ``torch.no_grad()``, ``.detach()``-ed, or from stored
rollout log-probs has no gradient path to the policy: adding it to the loss
changes the logged number and nothing else.
"""

from __future__ import annotations

from kllint.analysis import ir
from kllint.analysis.gradient import Direction
from kllint.analysis.sites import KLSite
from kllint.rules.base import Rule, estimate


def applies(site: KLSite) -> bool:
    # Only where the loss as a whole is meant to be differentiated: a
    # ``return loss.detach()`` for logging detaches everything on purpose.
    return (
        site.profile.direction is Direction.NONE
        and not site.loss_detached
        # A claim of absence: an unknown factor might be the gradient path
        # (an unknown divisor is a token count), and a policy log-prob outside
        # any detach means the zero came from two log-probs kllint cannot tell
        # apart, not from a missing path.
        and not ir.has_unknown_gradient_but_normalisers(site.term)
        and not site.gradient_names
    )


def headline(site: KLSite) -> str:
    return f"{estimate(site, 'term')} in the loss has no gradient: the KL does not regularise"


def reason(site: KLSite) -> str:
    return (
        "it was computed under no_grad, detached, or from stored log-probs: its gradient is 0, "
        "so adding it changes the logged loss and nothing else"
    )


RULE = Rule(
    code="KL005",
    name="kl-loss-without-gradient",
    summary="A KL term reaches a loss but is computed without gradient (under no_grad, or detached): the regulariser does nothing.",
    applies=applies,
    headline=headline,
    reason=reason,
    fix_title="Compute the policy log-probs of the KL term with gradient (outside torch.no_grad(), without .detach())",
    confirms={"bandit": frozenset({"zero-gradient"}), "sequences": frozenset({"zero-gradient"})},
    claim="no gradient",
)
