"""Which expression a fix replaces, and with what text.

The rewrite is a value-preserving surrogate: the forward value (what the code
logs and what any other reader of the variable sees) is unchanged, and the
gradient becomes the one of KL(pi||pi_ref):

* per token of a sequence, ``value.detach() + G_t * (logp_t - logp_t.detach())``
  with ``G_t = sum_{s >= t} sg(logp_s - ref_s) * mask_s``, the reward-to-go of
  the log-ratio (a masked reverse cumulative sum over the time axis): the
  gradient of the sequence KL is ``E[sum_t G_t grad logp_t]``;
* for one action (no time axis), ``value.detach() + sg(logp - ref) * (logp -
  logp.detach())``: the score function ``E[logr grad logp]``.

The second summand is zero in value (``x - x.detach()``), so the surrogate
logs exactly what the code logged; its gradient is ``G_t grad logp_t``. The
text uses the user's own names for the log-probs and the mask, and tensor
methods (``.flip(-1).cumsum(-1).flip(-1)``) so that no import is needed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

import libcst as cst

from kllint.findings import Finding
from kllint.fix.adapter import Target

FIXABLE_CODES = ("KL001", "KL002", "KL003")

# Why the other rules have no automatic fix: each correct rewrite would change
# the value the code computes, or needs a log-prob the code does not have.
NO_FIX = {
    "KL004": "a correct rewrite changes the reward's value (k3 -> the log-ratio); "
    "edit the reward by hand",
    "KL005": "no log-prob with a gradient is in reach of the estimate; "
    "compute it outside torch.no_grad() by hand",
    "KL006": "flipping the sign changes the value the code computes; edit it by hand",
}


class Applicability(str, enum.Enum):
    """Ruff's fix applicability."""

    SAFE = "safe"
    UNSAFE = "unsafe"
    DISPLAY_ONLY = "display-only"


@dataclass
class Plan:
    """One fix: the node to replace, its replacement, and every finding it resolves."""

    node: cst.BaseExpression
    replacement: cst.BaseExpression
    applicability: Applicability
    message: str
    findings: list[Finding]
    # The harness instance that decides (None: variable-length sequences, the
    # general case): "sequences" when a 1/|y| normalisation is only right for
    # equal lengths, "bandit" for a one-action rewrite with no time axis.
    instance: str | None = None
    notes: list[str] = field(default_factory=list)
    target: Target | None = field(default=None, repr=False)
    sign: int = 1


@dataclass
class Refusal:
    finding: Finding
    reason: str


SCORE_FUNCTION = (
    "the KL is a detached weight (a per-token reward): crediting later tokens means "
    "turning the rewards into returns, which changes their value"
)


def plan(targets: list[Target]) -> tuple[list[Plan], list[Refusal]]:
    """A plan per bug: findings that report the same expression (at several
    call sites, or by two rules) share one fix."""
    plans: dict[int, Plan] = {}
    refusals: list[Refusal] = []
    for target in targets:
        reason = refusal(target)
        if reason is not None:
            refusals.append(Refusal(target.finding, reason))
            continue
        existing = plans.get(id(target.node))
        if existing is not None:
            existing.findings.append(target.finding)
            continue
        try:
            plans[id(target.node)] = make(target, [target.finding])
        except cst.ParserSyntaxError:
            refusals.append(Refusal(target.finding, "the user's names do not form an expression"))
    return list(plans.values()), refusals


def make(target: Target, findings: list[Finding]) -> Plan:
    """The plan that replaces ``target.node``; raises ``libcst.ParserSyntaxError``
    when the names do not form an expression."""
    assert isinstance(target.node, cst.BaseExpression)
    applicability, notes, instance = _applicability(target)
    return Plan(
        node=target.node,
        replacement=_replacement(target, 1),
        applicability=applicability,
        message=_message(target),
        findings=list(findings),
        instance=instance,
        notes=notes,
        target=target,
    )


def widened(target: Target, parent: cst.CSTNode | None) -> Target:
    """``0.5 * (logp - ref) ** 2``: the estimate is the product with its
    numeric constant (k2 is ``0.5 * logr**2``), so the surrogate replaces the
    product and its gradient is the KL's, not half of it."""
    if (
        isinstance(parent, cst.BinaryOperation)
        and isinstance(parent.operator, (cst.Multiply, cst.Divide))
        and (parent.left is target.node or parent.right is target.node)
    ):
        other = parent.right if parent.left is target.node else parent.left
        if isinstance(other, (cst.Integer, cst.Float)):
            return replace(target, node=parent)
    return target


def negated(p: Plan) -> Plan:
    """The same plan with the score term subtracted: for an estimate written
    with the opposite orientation (``ref - logp`` negated afterwards)."""
    assert p.target is not None
    return replace(p, replacement=_replacement(p.target, -p.sign), sign=-p.sign)


def _replacement(target: Target, sign: int) -> cst.BaseExpression:
    node = target.node
    assert isinstance(node, cst.BaseExpression)
    replacement = cst.parse_expression(surrogate_text(target, sign))
    if node.lpar:
        replacement = replacement.with_changes(lpar=node.lpar, rpar=node.rpar)
    return replacement


def surrogate_text(target: Target, sign: int = 1) -> str:
    policy, reference = target.policy[0], target.reference[0]
    value = _code(target.node)
    if not _is_primary(target.node):
        value = f"({value})"
    log_ratio = f"({policy} - {reference}).detach()"
    if target.per_token:
        masked = f"({log_ratio} * {target.mask})" if target.mask else log_ratio
        weight = f"{masked}.flip(-1).cumsum(-1).flip(-1)"
    else:
        weight = log_ratio
    plus = "+" if sign > 0 else "-"
    credit = f"{weight} * ({policy} - {policy}.detach())"
    if target.per_token and target.per_sequence_estimate:
        # One value per sequence: the tokens' credit is summed to its shape.
        credit = f"({credit}).sum(-1)"
    return f"{value}.detach() {plus} {credit}"


def refusal(target: Target) -> str | None:
    code = target.finding.code
    if code in NO_FIX:
        return NO_FIX[code]
    if code not in FIXABLE_CODES:
        return "no automatic fix for this rule"
    if not isinstance(target.node, cst.BaseExpression):
        return "the estimate is not an expression of this file"
    if target.importance_weighted:
        return (
            "the estimate is multiplied by an importance ratio outside it, which a surrogate "
            "of the estimate alone cannot see"
        )
    if target.behaviour:
        return "the estimate is computed from the behaviour policy's log-probs, not the policy's"
    if len(target.policy) != 1 or len(target.reference) != 1:
        return "the estimate mixes several policy or reference log-probs"
    for name in (*target.policy, *target.reference, *([target.mask] if target.mask else [])):
        if not _is_expression(name):
            return f"`{name}` is not a name the rewrite can reuse"
    return None


def _applicability(target: Target) -> tuple[Applicability, list[str], str | None]:
    notes: list[str] = []
    instance = None
    if not target.per_token and not target.sequence_atoms:
        instance = "bandit"
        notes.append(
            "nothing shows a time axis: the rewrite is right for one action per sample; "
            "if these are token log-probs, the reward-to-go form is needed instead"
        )
    if target.inferred_mask:
        notes.append(
            f"the time axis and the mask are inferred from `{target.mask}` where the estimate "
            "enters the loss: the rewrite assumes [batch, time] log-probs with time last"
        )
    if target.per_token and target.per_sequence_mean:
        instance = "sequences"
        notes.append(
            "the loss divides each sequence by its own length (1/|y|): the reward-to-go gradient "
            "is correct up to a constant only when every sequence has the same length; "
            "changing the normalisation is the user's decision"
        )
    if target.per_token and target.mask is None:
        notes.append(
            "no mask is in reach: if sequences are padded, padded positions enter the reward-to-go"
        )
    return (Applicability.UNSAFE if notes else Applicability.SAFE), notes, instance


def _message(target: Target) -> str:
    what = "the sequence KL(pi||pi_ref)" if target.per_token else "KL(pi||pi_ref)"
    where = " at the call" if target.in_helper else ""
    return f"Keep the value of `{_short(target.node)}`{where}, give it the gradient of {what}"


def _short(node: cst.CSTNode | None, limit: int = 48) -> str:
    text = " ".join(_code(node).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _code(node: cst.CSTNode | None) -> str:
    if node is None:
        return ""
    code = cst.Module(body=[]).code_for_node(node)
    if isinstance(node, cst.BaseExpression) and node.lpar:
        # The replacement keeps the node's own parentheses; inside them the value.
        code = cst.Module(body=[]).code_for_node(node.with_changes(lpar=[], rpar=[]))
    return code


def _is_primary(node: cst.CSTNode | None) -> bool:
    """Binds tighter than ``.detach()``: no parentheses needed before it."""
    return isinstance(node, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) and not (
        isinstance(node, cst.BaseExpression) and node.lpar
    )


def _is_expression(text: str) -> bool:
    try:
        cst.parse_expression(text)
    except cst.ParserSyntaxError:
        return False
    return True
