"""What a rule claims the harness will measure, per regime, and the check
of a measurement against it. Torch-free: rules declare their claims in
these terms, and ``--confirm`` reports ``confirmed`` or ``contradicted``
against them before any number.

A regime is a tabular instance (:mod:`kllint.harness.tabular`): the shape
of the sequences (one action, fixed or variable length) and how far the
policy is from the reference (about 1 nat per token, or about 0.05, where
runs spend most of their steps), and for losses with a behaviour policy,
samples drawn from one a few updates behind. An instance name may carry a
variant after ``@`` (``variable_length@B=2``: the code at batch size 2;
``variable_length@alpha=0.5``: a coefficient set to 0.5), judged by the
claim of its regime.

A claim is the set of verdicts (:data:`kllint.harness.verdict.VERDICTS`,
taken up to a positive factor) the rule accepts in each regime. A verdict
outside it is a defect of the rule or of the harness, never a matter of
wording.
"""

from __future__ import annotations

from dataclasses import dataclass

from kllint.analysis import ir
from kllint.analysis.gradient import Unsupported, profile
from kllint.analysis.ir import Axis, Role
from kllint.analysis.sites import length_normalised
from kllint.harness.regimes import (
    BANDIT,
    FAR,
    OFF_POLICY,
    REGIMES,
    VARIABLE,
    label,
    regime_of,
)
from kllint.harness.verdict import BIASED, NEGATED

CONFIRMED = "confirmed"
CONTRADICTED = "contradicted"
UNCONFIRMED = "unconfirmed"
OUTCOMES = (CONFIRMED, CONTRADICTED, UNCONFIRMED)


@dataclass(frozen=True)
class Claim:
    """The verdicts a rule accepts, per regime (a regime left out accepts
    anything), and the rule's words for them."""

    code: str
    verdicts: dict[str, frozenset[str]]
    statement: str
    # Verdicts also accepted at a finite batch size (``@B=2``): where a
    # statistic of the batch enters the term nonlinearly (whitening, a
    # baseline that includes the sample), the claim is the large-batch one.
    finite_batch: frozenset[str] = frozenset()

    def accepts(self, instance: str, verdict: str) -> bool:
        allowed = self._allowed(instance)
        return allowed is None or verdict in allowed

    def expected(self, instance: str) -> str:
        allowed = self._allowed(instance)
        return " or ".join(sorted(allowed)) if allowed else "anything"

    def _allowed(self, instance: str) -> frozenset[str] | None:
        allowed = self.verdicts.get(regime_of(instance))
        if allowed is not None and "@B=" in instance:
            return allowed | self.finite_batch
        return allowed


def _subtracted(term: ir.Node) -> bool:
    try:
        return profile(term).scale < 0
    except Unsupported:
        return False


def clamped(term: ir.Node) -> bool:
    """A clamp on a per-token value: active far from the reference only."""
    return any(isinstance(n, ir.Clamp) and (n.low, n.high) != (None, None) for n in term.walk())


def claim_for(code: str, term: ir.Node) -> Claim | None:
    """The claim of rule ``code`` on ``term``; None for a code without one."""
    from kllint.rules import RULES  # the rule declares its claim

    rule = RULES.get(code)
    if rule is None or not rule.confirms:
        return None
    one_action, sequences, statement = rule.confirms[BANDIT], rule.confirms["sequences"], rule.claim
    verdicts = {regime: sequences for regime in REGIMES}
    verdicts[BANDIT] = one_action
    if clamped(term):
        # verl/OpenRLHF clamp k3 to [-10, 10]: inactive near the reference.
        for regime in FAR:
            verdicts[regime] = verdicts[regime] | {BIASED}
        statement += " (near the reference; a clamp biases it far from it)"
    if not term.has_role(ir.Role.MASK):
        # Padded positions carry log-probs: unmasked, they enter the sum.
        for regime in VARIABLE:
            verdicts[regime] = verdicts[regime] | {BIASED}
        statement += "; biased on variable lengths if padding is not masked"
    if term.has_role(ir.Role.OLD_LOGP):
        # Samples from pi_old: only an importance-weighted estimate keeps
        # its on-policy expectation.
        verdicts[OFF_POLICY] = verdicts[OFF_POLICY] | {BIASED}
    if code != "KL006" and _subtracted(term):
        # The rule claims a direction; a term that enters the loss with a
        # minus sign is measured as its negation (KL006 reports the sign).
        for regime in REGIMES:
            verdicts[regime] = verdicts[regime] | {NEGATED}
        statement += " (with the sign the loss gives it)"
    if length_normalised(term) and ir.depends_on_policy(term):
        # (A term without gradient stays without it, however it is scaled.)
        # The rule's own verdict up to a factor that depends on the policy
        # (a per-token term averaged over each sequence, open-instruct's
        # masked_mean) is measured as that verdict, and is as wrong.
        for regime in VARIABLE:
            verdicts[regime] = verdicts[regime] | {BIASED}
        statement += "; biased on variable lengths (each sequence divided by its own length)"
    finite_batch: frozenset[str] = frozenset()
    if batch_nonlinear(term):
        finite_batch = frozenset({BIASED})
        statement += "; at a small batch size, a statistic of the batch (whitening) biases it"
    return Claim(code, verdicts, statement, finite_batch)


def batch_nonlinear(term: ir.Node) -> bool:
    """True when a statistic of the batch (a mean over sequences) enters the
    term nonlinearly: its square, a product with another per-sequence value
    (a baseline that includes the sample). Then the large-batch limit is not
    what the code computes at any batch size, and finite batches are evaluated."""
    found = False

    def logps(node: ir.Node) -> bool:
        # A token count (``mask.sum()``) normalises; it is the large-batch
        # limit's constant, not a statistic of the log-probs.
        return any(a.role not in (Role.COEFFICIENT, Role.MASK) for a in node.atoms())

    def visit(node: ir.Node) -> bool:
        """Whether ``node`` is (derived from) a batch statistic of the rows."""
        nonlocal found
        if isinstance(node, ir.Reduce):
            inner = visit(node.arg)
            if node.mask is not None:
                visit(node.mask)
            return inner or (node.axis in (Axis.BATCH, Axis.ALL) and logps(node.arg))
        if isinstance(node, ir.Unary):
            inner = visit(node.arg)
            if inner and node.op not in ("neg", "detach"):
                found = True
            return inner
        if isinstance(node, ir.Binary):
            left, right = visit(node.left), visit(node.right)
            if node.op in ("add", "sub"):
                return left or right
            if (
                (node.op == "pow" and left)
                or (left and logps(node.right))
                or (right and logps(node.left))
            ):
                found = True
            return left or right
        if isinstance(node, ir.Clamp):
            inner = visit(node.arg)
            found = found or inner
            return inner
        return any([visit(c) for c in node.children()])

    visit(term)
    return found


def check(claim: Claim, verdicts: dict[str, str]) -> tuple[str, list[str]]:
    """``(outcome, contradictions)`` for the verdicts measured per instance
    (already up to a positive factor); each contradiction in words."""
    wrong = [
        f"{label(instance)}: measured {verdict}, claimed {claim.expected(instance)}"
        for instance, verdict in verdicts.items()
        if not claim.accepts(instance, verdict)
    ]
    return (CONTRADICTED if wrong else CONFIRMED), wrong
