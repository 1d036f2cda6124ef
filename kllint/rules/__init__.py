"""The rules: one module per rule, each a predicate over KL sites.

``RULES`` is the public contract of codes and names."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RuleInfo:
    code: str
    name: str
    summary: str  # one line: what fires it
    severity: str = "error"


RULES: dict[str, RuleInfo] = {
    info.code: info
    for info in (
        RuleInfo(
            "KL001",
            "differentiated-k1-estimate",
            "The k1 estimate log pi - log pi_ref is differentiated as a loss: its expected gradient is zero.",
        ),
        RuleInfo(
            "KL002",
            "differentiated-k3-estimate",
            "The k3 / low_var_kl estimate is differentiated as a loss: its expected gradient is that of KL(pi_ref||pi), not KL(pi||pi_ref).",
        ),
        RuleInfo(
            "KL003",
            "token-level-kl-gradient",
            "A per-token KL gradient term is summed over tokens (or a per-token KL penalty enters a policy gradient without a reward-to-go): a partial gradient of the sequence KL(pi||pi_ref).",
        ),
        RuleInfo(
            "KL004",
            "k3-estimate-as-reward",
            "The k3 estimate is used as a reward (score-function weight): its expected gradient is grad KL(pi||pi_ref) - grad KL(pi_ref||pi), nearly zero near the reference.",
        ),
        RuleInfo(
            "KL005",
            "kl-loss-without-gradient",
            "A KL term reaches a loss but is computed without gradient (under no_grad, or detached): the regulariser does nothing.",
        ),
        RuleInfo(
            "KL006",
            "negated-kl-penalty",
            "A KL penalty enters a minimised loss with a negative sign (or a KL reward is added): gradient descent increases KL(pi||pi_ref).",
        ),
    )
}


def lookup(code_or_name: str) -> list[RuleInfo]:
    """Rules matched by a code, a code prefix (``KL``, ``KL00``) or a name."""
    key = code_or_name.strip()
    if not key:
        return []
    upper = key.upper()
    return [r for r in RULES.values() if r.code.startswith(upper) or r.name == key.lower()]


def all_rules() -> list:  # list[kllint.rules.base.Rule]; imported lazily to keep this module light
    from kllint.rules import (
        kl001_differentiated_k1,
        kl002_differentiated_k3,
        kl003_token_level_kl,
        kl004_k3_as_reward,
        kl005_kl_loss_without_gradient,
        kl006_negated_kl_penalty,
    )

    return [
        kl001_differentiated_k1.RULE,
        kl002_differentiated_k3.RULE,
        kl003_token_level_kl.RULE,
        kl004_k3_as_reward.RULE,
        kl005_kl_loss_without_gradient.RULE,
        kl006_negated_kl_penalty.RULE,
    ]
