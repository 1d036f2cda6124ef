"""KL sites: the terms of a loss that involve the reference policy, with the
gradient profile the rules judge.

A loss such as ``-(ratio * adv - beta * kl).mean() + entropy_term`` is a sum
of terms; reductions, masks, signs and coefficients are linear, so each term
can be judged on its own. The policy-gradient term (no reference log-prob)
is not a KL site; ``ratio * beta * kl`` is. The split never cuts inside an
estimator: ``logp - ref`` stays one term, because its policy side is plain
log-prob arithmetic rather than a separate loss.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from kllint.analysis import ir
from kllint.analysis.gradient import (
    UNCLASSIFIED,
    GradientProfile,
    Unsupported,
    estimator_name,
    profile,
)
from kllint.analysis.ir import Role
from kllint.analysis.policy_words import names_a_guard
from kllint.analysis.roles import (
    CURRENT_WORDS,
    DEMONSTRATION_WORDS,
    KL_TERM_WORDS,
    PREFERENCE_WORDS,
    TOKEN_WORDS,
    has_words,
)

_LOGPROB_ROLES = (Role.POLICY_LOGP, Role.OLD_LOGP)


@dataclass
class KLSite:
    """One additive term of a loss that involves the reference log-prob.

    ``term`` is the whole term as the code computes it, with its sign,
    coefficients, importance ratios, masks and reductions: the harness
    evaluates exactly this. ``focus`` is the KL-bearing subexpression, used
    to name the estimator and to place the finding.
    """

    term: ir.Node
    focus: ir.Node
    origin: ir.Origin
    sink: str  # how it reaches a loss: "`loss.backward()`", "returned by `compute_loss`", ...
    strong_sink: bool = True
    profile: GradientProfile = UNCLASSIFIED
    estimator: str = "KL estimate"
    branch: str = ""  # the condition under which this alternative is taken
    # Where the loss holding the term comes from.
    loss_detached: bool = False  # the whole loss is detached (``return loss.detach()``)
    function_node: cst.CSTNode | None = None  # the function whose sink it reaches
    backward: bool = False  # the loss reaches ``.backward()`` itself
    # The plain estimate an importance-weighted one is written from (the
    # finding is placed at the weighting): one expression, for one finding.
    estimate_node: object = field(default=None, compare=False, repr=False)

    @property
    def policy_names(self) -> list[str]:
        return _names(self.term, Role.POLICY_LOGP)

    @property
    def reference_names(self) -> list[str]:
        return _names(self.term, Role.REFERENCE_LOGP)

    @property
    def old_names(self) -> list[str]:
        return _names(self.term, Role.OLD_LOGP)

    @property
    def gradient_names(self) -> list[str]:
        """Policy log-probs the term's gradient flows through (not detached)."""
        seen: list[str] = []
        visited: set[int] = set()  # shared subtrees once (``kl = kl + kl``)

        def visit(node: ir.Node) -> None:
            if (isinstance(node, ir.Unary) and node.op == "detach") or id(node) in visited:
                return
            visited.add(id(node))
            if (
                isinstance(node, ir.Atom)
                and node.role is Role.POLICY_LOGP
                and node.name not in seen
            ):
                seen.append(node.name)
            for child in node.children():
                visit(child)

        visit(self.term)
        return seen

    @property
    def estimate_names(self) -> list[str]:
        """The policy (or behaviour) log-probs inside the KL estimate itself."""
        return _names(self.focus, Role.POLICY_LOGP) + _names(self.focus, Role.OLD_LOGP)

    @property
    def has_time_axis(self) -> bool:
        """Evidence that the log-probs are per token of a sequence (a
        reduction over time, a mask, a reward-to-go, token-level names).
        Without it, ``(0.5 * (logp - ref) ** 2).mean()`` may be a batch of
        single actions, for which a per-sample k2 is the right gradient."""
        for node in self.term.walk():
            if isinstance(node, ir.CumSum) or (
                isinstance(node, ir.Reduce) and (node.axis is ir.Axis.TIME or node.mask is not None)
            ):
                return True
            if isinstance(node, ir.Atom) and (
                node.role is Role.MASK or node.per_token or has_words(node.name, TOKEN_WORDS)
            ):
                return True
        return False

    @property
    def importance_weighted(self) -> bool:
        """The focus is multiplied by exp(logp - sg(logp)) or pi/pi_old."""
        return _has_ratio_factor(self.term, self.focus)

    @property
    def score_function(self) -> bool:
        """The KL enters only through a detached weight on a log-prob."""
        return not ir.depends_on_policy(self.focus) and ir.depends_on_policy(self.term)


def _names(node: ir.Node, role: Role) -> list[str]:
    seen: list[str] = []
    for atom in node.atoms():
        if atom.role is role and atom.name not in seen:
            seen.append(atom.name)
    return seen


def kl_terms(value: ir.Node) -> list[ir.Node]:
    """The additive terms of a loss that involve the reference log-prob."""
    terms = _split(value)
    # ``sg(log_ratio) + kl_to_go * (logp - sg(logp))`` with a weight kllint
    # cannot read: the KL's value is there, its gradient is in the other term.
    unread = any(_score_with_an_unread_weight(t) for t in terms)
    return [
        t
        for t in terms
        if t.has_role(Role.REFERENCE_LOGP)
        and any(t.has_role(r) for r in _LOGPROB_ROLES)
        and not any(a.level is ir.Level.DISTRIBUTION for a in t.atoms())
        and not _is_preference_contrast(t)
        and not _on_demonstrations(t)
        and not _is_value_regression(t)
        and not (unread and not ir.depends_on_policy(t))
    ]


def _score_with_an_unread_weight(term: ir.Node) -> bool:
    """``w * (logp - sg(logp))``, a score-function surrogate (value zero,
    gradient ``w * grad logp``) whose weight is beyond what kllint reads (not
    an advantage: ``exp(logp - sg(logp)) * adv`` is the policy gradient)."""

    return any(
        isinstance(n, ir.Binary)
        and n.op == "mul"
        and any(
            _is_score(side)
            and any(isinstance(w, ir.Opaque) for w in weight.walk())
            and not weight.has_role(Role.ADVANTAGE)
            for side, weight in ((n.left, n.right), (n.right, n.left))
        )
        for n in term.walk()
    )


def _is_score(n: ir.Node) -> bool:
    """``logp - sg(logp)``: zero, with the gradient of the log-probs."""
    return (
        isinstance(n, ir.Binary)
        and n.op == "sub"
        and isinstance(n.right, ir.Unary)
        and n.right.op == "detach"
        and n.right.arg is n.left
        and n.left.has_role(Role.POLICY_LOGP)
    )


def _is_value_regression(term: ir.Node) -> bool:
    """A critic's loss whose target holds the KL (``(values - returns) ** 2``
    with a KL reward in the returns): the KL reaches it only as a regression
    target next to a value prediction. It trains the critic, it is not a KL
    to the reference."""
    regressions = {
        id(node)
        for node in term.walk()
        if isinstance(node, ir.Binary)
        and node.op == "pow"
        and isinstance(node.right, ir.Const)
        and node.right.value == 2
        and isinstance(node.left, ir.Binary)
        and node.left.op == "sub"
        and any(
            not _has_reference(side)
            and side.has_role(Role.ADVANTAGE)
            # The KL in the target, not differentiated (OPMD's ``(r - tau *
            # log_ratio) ** 2`` regresses the policy's own log-ratio: a KL).
            and not ir.depends_on_policy(other)
            for side, other in (
                (node.left.left, node.left.right),
                (node.left.right, node.left.left),
            )
        )
    }
    return bool(regressions) and not ir.reaches(
        term,
        found=lambda n: isinstance(n, ir.Atom) and n.role is Role.REFERENCE_LOGP,
        stop=lambda n: id(n) in regressions,
    )


def _is_preference_contrast(term: ir.Node) -> bool:
    """DPO/IPO-style losses compare log-ratios of two *fixed* responses
    (chosen vs rejected). They are not a KL to the reference estimated on
    samples from pi, so the on-policy gradient analysis does not apply."""
    policy = _names(term, Role.POLICY_LOGP) + _names(term, Role.OLD_LOGP)
    reference = _names(term, Role.REFERENCE_LOGP)
    if len(policy) >= 2 and len(reference) >= 2:
        return True
    return any(has_words(n, PREFERENCE_WORDS) for n in policy + reference)


def _on_demonstrations(term: ir.Node) -> bool:
    """``(ptx_sft_log_probs - ptx_log_probs).sum(-1).mean()``: the policy's
    log-probs of demonstrations or a pretraining mix, an NLL on data the
    policy did not sample, written against the reference so that it reads
    zero at the start. The on-policy gradient analysis does not apply."""
    policy = _names(term, Role.POLICY_LOGP)
    return bool(policy) and all(has_words(n, DEMONSTRATION_WORDS) for n in policy)


def _has_reference(node: ir.Node) -> bool:
    return node.has_role(Role.REFERENCE_LOGP)


def _is_separate_loss(node: ir.Node) -> bool:
    """A reference-free side that is a loss of its own (a policy-gradient
    term, an entropy bonus), not log-prob arithmetic of an estimator."""
    for leaf in node.walk():
        if isinstance(leaf, ir.Opaque):
            return True
        if isinstance(leaf, ir.Atom) and leaf.role not in (
            *_LOGPROB_ROLES,
            Role.COEFFICIENT,
            Role.MASK,
        ):
            return True
    return False


def _entropy_bonuses(pieces: list[ir.Node]) -> list[ir.Node]:
    """The scaled policy log-probs beside KL pieces that each hold the policy's
    log-probs too (``-alpha * logp - kl_coef * k3`` in a soft-RL reward, all
    without gradient): an entropy bonus, a term of its own. Beside a piece of
    reference log-probs alone it is the policy's half of a log-ratio
    (``-beta * logp + beta * ref``); beside a piece with the policy's gradient
    it is part of a surrogate (``k1.detach() + logp - logp.detach()``)."""
    kl_pieces = [p for p in pieces if _has_reference(p)]
    if (
        not kl_pieces
        or not all(p.has_role(Role.POLICY_LOGP) for p in kl_pieces)
        or any(map(ir.depends_on_policy, pieces))
    ):
        return []
    return [p for p in pieces if not _has_reference(p) and _scaled_log_prob(p)]


def _scaled_log_prob(node: ir.Node) -> bool:
    return node.has_role(Role.POLICY_LOGP) and all(
        isinstance(n, (ir.Const, ir.Reduce))
        or (isinstance(n, ir.Atom) and n.role in (Role.POLICY_LOGP, Role.COEFFICIENT, Role.MASK))
        or (isinstance(n, ir.Unary) and n.op in ("neg", "detach"))
        or (isinstance(n, ir.Binary) and n.op == "mul")
        for n in node.walk()
    )


def _past_factor(node: ir.Node) -> ir.Node | None:
    """The KL side of a product or quotient by a reference-free factor
    (a coefficient, a mask, an importance ratio), else None."""
    if isinstance(node, ir.Binary) and node.op in ("mul", "div") and not _has_reference(node.right):
        return node.left
    if (
        isinstance(node, ir.Binary)
        and node.op in ("mul", "div", "sub")
        and _has_reference(node.left)
        and ir.is_batch_statistic(node.right)
    ):
        return node.left  # whitened: ``(x - mean) * torch.rsqrt(var + eps)``
    if isinstance(node, ir.Binary) and node.op == "mul" and not _has_reference(node.left):
        return node.right
    return None


def _is_reduced(node: ir.Node) -> bool:
    """Already a loss of its own: a reduction under signs and coefficients."""
    while True:
        inner = _past_factor(node)
        if isinstance(node, ir.Unary) and node.op == "neg":
            node = node.arg
        elif inner is not None:
            node = inner
        else:
            return isinstance(node, ir.Reduce)


def _a_reduced_loss(node: ir.Node) -> bool:
    """A loss reduced over the batch, possibly weighted (``sft_weight *
    nll.sum(-1).mean()``); not one value per sequence (``logp.sum(-1)``)."""
    while isinstance(node, ir.Unary) and node.op == "neg":
        node = node.arg
    if isinstance(node, ir.Binary) and node.op in ("mul", "div"):
        sides = [node.left, node.right] if node.op == "mul" else [node.left]
        return any(_a_reduced_loss(side) for side in sides)
    return isinstance(node, ir.Reduce) and node.axis in (ir.Axis.BATCH, ir.Axis.ALL)


def additive_terms(node: ir.Node) -> list[ir.Node]:
    """The additive terms of a value, as the rules judge them one by one."""
    return _split(node)


def _split(node: ir.Node) -> list[ir.Node]:
    origin = node.origin
    if isinstance(node, ir.Binary) and node.op in ("add", "sub"):
        return _split_sum(node)
    if isinstance(node, ir.Unary) and node.op in ("neg", "detach"):
        return [ir.Unary(node.op, t, origin=origin) for t in _split(node.arg)]
    if (
        isinstance(node, ir.Binary)
        and node.op in ("max", "min")
        and _has_reference(node.left)
        and _has_reference(node.right)
    ):
        # PPO's clipped objective max(-A * ratio, -A * clip(ratio)): on fresh
        # samples (ratio = 1) both sides agree and the gradient is the first's.
        # Dual clip's min(-A * c, loss) bounds the loss by a constant: the
        # gradient is the side that has one.
        if not ir.depends_on_policy(node.left) and ir.depends_on_policy(node.right):
            return _split(node.right)
        return _split(node.left)
    if isinstance(node, ir.Reduce):
        return [
            ir.Reduce(node.kind, node.axis, t, node.mask, origin=origin) for t in _split(node.arg)
        ]
    if isinstance(node, ir.CumSum):
        return [ir.CumSum(t, node.reverse, node.discount, origin=origin) for t in _split(node.arg)]
    if isinstance(node, ir.Clamp) and node.low is None and node.high is None:
        # ``returns.clamp(-clip, clip)`` with bounds from the settings: a
        # guard, the identity where the analysis measures (as the gradient
        # reads it); the task score beside the KL comes out as for a sum.
        return [ir.Clamp(t, None, None, origin=origin) for t in _split(node.arg)]
    if isinstance(node, ir.Binary):
        return _split_product(node)
    return [node]


def _to_different_references(pieces: list[ir.Node]) -> bool:
    """Losses each reduced on its own, or estimates each of a whole log-ratio
    (two KL rewards), each against reference log-probs no other piece reads
    (``ref_logp`` and ``reset_ref_logp``): two regularisers."""
    if len(pieces) < 2 or not all(_is_reduced(p) or _holds_a_log_ratio(p) for p in pieces):
        return False
    if any(_is_score(n) for p in pieces for n in p.walk()):
        # ``sg(k3) + kl_to_go * (logp - sg(logp))``: one KL's value and its
        # gradient, however a helper named the reference it was given.
        return False
    seen: set[str] = set()
    for piece in pieces:
        names = {a.name for a in piece.atoms() if a.role is Role.REFERENCE_LOGP}
        if not names or names & seen:
            return False
        seen |= names
    return True


def _holds_a_log_ratio(piece: ir.Node) -> bool:
    return _has_reference(piece) and any(piece.has_role(role) for role in _LOGPROB_ROLES)


def _split_product(node: ir.Binary) -> list[ir.Node]:
    """A product or quotient by a reference-free factor distributes over the
    terms of the other side."""
    origin = node.origin
    if node.op == "mul":
        if not _has_reference(node.left) and _has_reference(node.right):
            return [ir.Binary("mul", node.left, t, origin=origin) for t in _split(node.right)]
        if not _has_reference(node.right) and _has_reference(node.left):
            return [ir.Binary("mul", t, node.right, origin=origin) for t in _split(node.left)]
    if node.op == "div" and not _has_reference(node.right):
        return [ir.Binary("div", t, node.right, origin=origin) for t in _split(node.left)]
    return [node]


def _split_sum(node: ir.Binary) -> list[ir.Node]:
    left_ref, right_ref = _has_reference(node.left), _has_reference(node.right)
    # ``kl_loss + sft_weight * nll.sum(-1).mean()``: a loss reduced over the
    # batch and free of the reference (an SFT term) is a loss of its own.
    split = (
        (
            left_ref
            and not right_ref
            and (_is_separate_loss(node.right) or _a_reduced_loss(node.right))
        )
        or (
            right_ref
            and not left_ref
            and (_is_separate_loss(node.left) or _a_reduced_loss(node.left))
        )
        or (
            left_ref
            and right_ref
            and _is_reduced(node.left)
            and _is_reduced(node.right)
            # ``returns - returns.mean()`` of summed KL rewards: a baseline,
            # one advantage with what it is subtracted from.
            and not (node.op == "sub" and _batch_baseline(node.right))
        )
        or (not left_ref and not right_ref)
    )
    rights = _split(node.right)
    if node.op == "sub":
        rights = [ir.neg(t, node.origin) for t in rights]
    # ``kl = kl + kl`` repeated: split the shared side once and keep each
    # piece once, or the pieces double with every line.
    lefts = rights if node.left is node.right and node.op == "add" else _split(node.left)
    pieces = list({id(p): p for p in lefts + rights}.values())
    if split or (
        # ``pg_loss + coef * ref_kl_loss + anchor_kl_loss``: each KL piece a
        # loss of its own with the policy's gradient, each its own term,
        # however the sum is nested. (A detached KL beside one, a dual
        # variable's loss, stays with the KL that regularises; a detached KL
        # to another reference, ``reset_kl`` beside ``sft_kl``, is its own.)
        (
            left_ref
            and right_ref
            and all(_is_reduced(p) and ir.depends_on_policy(p) for p in pieces if _has_reference(p))
        )
        or _to_different_references([p for p in pieces if _has_reference(p)])
    ):
        return pieces
    # Both sides involve the reference, as in ``rewards - baseline`` where
    # the rewards hold a KL: separate losses hidden inside (the task
    # score, an entropy bonus) still come out, the KL pieces stay together
    # as one term.
    bonuses = _entropy_bonuses(pieces)
    separate = [
        p
        for p in pieces
        if not _has_reference(p) and (_is_separate_loss(p) or any(p is b for b in bonuses))
    ]
    if not separate:
        return [node]
    kept = [p for p in pieces if not any(p is q for q in separate)]
    regrouped = kept[0]
    for piece in kept[1:]:
        regrouped = ir.Binary("add", regrouped, piece)  # no origin: synthetic
    return [regrouped, *separate]


def focus_of(term: ir.Node) -> ir.Node:
    """The KL-bearing subexpression: strip reductions, signs, detaches and
    reference-free factors (coefficients, masks, importance ratios)."""
    node = term
    while True:
        inner = _past_factor(node)
        if isinstance(node, ir.Binary) and node.op == "add" and node.origin is None:
            # A sum regrouped by ``_split``: follow its first KL piece.
            node = node.left if _has_reference(node.left) else node.right
        elif isinstance(node, ir.Binary) and node.op == "add" and _zero(node.left):
            # An accumulator's first value (``kl_loss = zeros(())``, then
            # ``kl_loss = kl_loss + chunk_kl.sum()`` in a loop): the term is
            # what is accumulated, written where each chunk's estimate is.
            node = node.right
        elif isinstance(node, ir.Binary) and node.op == "sub" and _zero(node.left):
            # ``token_rewards = torch.zeros_like(mask)``, then
            # ``token_rewards - beta * kl``: a negation, the estimate is ``kl``.
            node = node.right
        elif (
            isinstance(node, ir.Binary)
            and node.op == "add"
            and (_times_zero(node.right) or _zero(node.right))
        ):
            # GAE's first step: ``delta + gamma * lam * lastgaelam`` with
            # ``lastgaelam = 0``; an undiscounted return's, ``r_t + running``.
            node = node.left
        elif (
            isinstance(node, (ir.Reduce, ir.CumSum))
            or (isinstance(node, ir.Unary) and node.op in ("neg", "detach"))
            or isinstance(node, ir.Clamp)
        ):
            node = node.arg
        elif inner is not None:
            node = inner
        elif isinstance(node, ir.Binary) and node.op in ("max", "min"):
            # PPO's clipped objective: the unclipped operand carries the weight.
            node = node.left if _has_reference(node.left) else node.right
        elif (
            isinstance(node, ir.Binary)
            and node.op in ("add", "sub")
            and _has_reference(node.left) != _has_reference(node.right)
            and _beside_the_kl(node.right if _has_reference(node.left) else node.left)
        ):
            node = node.left if _has_reference(node.left) else node.right
        elif isinstance(node, ir.Binary) and node.op == "sub" and _batch_baseline(node.right):
            # ``returns - returns.mean(dim=1, keepdim=True)``, a leave-one-out
            # baseline: the other samples' rewards, written where they are.
            node = node.left
        else:
            return node


def _beside_the_kl(other: ir.Node) -> bool:
    """What a sum adds to its KL side that is no part of the estimate: a
    KL reward's task score, a value baseline subtracted (not the policy side
    of ``logp - ref``, which is the estimate), or a constraint's budget
    (``kl_budget - kl``: it moves the value, not the gradient)."""
    return _is_separate_loss(other) or _is_offset(other)


def _batch_baseline(node: ir.Node) -> bool:
    """A baseline of the batch's (a group's) rewards: without gradient, made
    by a reduction over the samples (``returns.mean()`` of per-sequence
    returns, summed over time first, is one)."""
    return not ir.depends_on_policy(node) and any(
        isinstance(n, ir.Reduce)
        and (
            n.axis is ir.Axis.BATCH
            or (
                n.axis is ir.Axis.ALL
                and any(isinstance(m, ir.Reduce) and m.axis is ir.Axis.TIME for m in n.arg.walk())
            )
        )
        for n in node.walk()
    )


def _is_offset(node: ir.Node) -> bool:
    """A setting (``kl_budget``, ``cfg.target_kl``), alone or in arithmetic
    with literals: no log-prob, mask or advantage. A bare literal is not one:
    k3's ``- 1`` belongs to the estimate."""
    return bool(node.atoms()) and ir.settings_only(node)


def _written_apart(term: ir.Node, weighted: ir.Binary) -> bool:
    """Whether the weighted estimate is written as its own expression
    (``kl = ratio * k3``), not inside the reduction that makes it a loss
    (``(ratio * kl * mask).sum()``, where the plain estimate is the line to
    change)."""
    if weighted.origin is None or weighted.origin.cst_node is None:
        return False
    around = [
        n for n in term.walk() if isinstance(n, ir.Reduce) and any(c is weighted for c in n.walk())
    ]
    reduction = around[-1] if around else None  # the innermost
    # Here, not at the top: the rules import this module, and a fully cached
    # run must not import LibCST (which ``syntax`` does on import).
    from kllint.analysis.syntax import descendants

    written = reduction.origin.cst_node if reduction and reduction.origin else None
    if not isinstance(written, cst.CSTNode):
        return True
    target = weighted.origin.cst_node
    return not any(n is target for n in descendants(written))


def _zero(node: ir.Node) -> bool:
    return isinstance(node, ir.Const) and node.value == 0


def _times_zero(node: ir.Node) -> bool:
    return (
        isinstance(node, ir.Binary)
        and node.op == "mul"
        and (
            _zero(node.left)
            or _zero(node.right)
            or _times_zero(node.left)
            or _times_zero(node.right)
        )
    )


def _has_ratio_factor(term: ir.Node, focus: ir.Node) -> bool:
    return _ratio_weighted(term, focus) is not None


def _ratio_weighted(term: ir.Node, focus: ir.Node) -> ir.Binary | None:
    """The product of an importance ratio and the estimate, if the term
    weights its estimate by one (``exp(logp - old_logp) * k3``)."""
    node = term
    while node is not focus:
        if isinstance(node, ir.Binary) and node.op == "mul":
            other = node.left if _has_reference(node.right) else node.right
            if isinstance(other, ir.Unary) and other.op == "exp" and ir.depends_on_policy(other):
                return node
            node = node.right if _has_reference(node.right) else node.left
        elif isinstance(node, (ir.Reduce, ir.CumSum, ir.Unary)):
            node = node.arg
        elif isinstance(node, ir.Binary):
            node = node.left
        else:
            return None
    return None


def _detached_on_the_way(path: list[ir.Node]) -> bool:
    """Whether the estimate reaches the term as a detached weight (a KL
    reward made under ``no_grad``, then added to the advantages)."""
    return any(isinstance(n, ir.Unary) and n.op == "detach" for n in path[:-1])


def _score_function(path: list[ir.Node]) -> ir.Node | None:
    """Where a KL term is written as a score function: the innermost product
    of the detached weight and the policy's log-probs, when the code names
    it a KL (``kl_term = (kl_to_go * logps * mask).sum()``). The weight alone
    has no gradient; that line is the estimate, and
    ``log_ratio = (logp - ref).detach()`` only its input. A product named
    otherwise is the policy-gradient loss weighting a KL reward, which is
    written where the reward is computed."""
    focus = path[-1]
    weight = focus.origin
    if weight is None:
        return None
    detached = not ir.depends_on_policy(focus)
    for index in range(len(path) - 2, -1, -1):
        node = path[index]
        if isinstance(node, ir.Unary) and node.op == "detach":
            detached = True
        if not detached:
            continue
        if isinstance(node, ir.Binary) and node.op in ("add", "sub"):
            # The weight joined other terms on its way (``scores + kl``, then
            # the advantages): a KL reward, written where it is computed.
            return None
        if (
            isinstance(node, ir.Binary)
            and node.op == "mul"
            and node.origin is not None
            and node.origin.cst_node is not None
            and not node.origin.assumed  # a loss kllint stands in for (stored advantages)
            # In the function that computes the weight: a KL reward the
            # policy-gradient loss multiplies elsewhere is written where it is
            # computed.
            and node.origin.function is weight.function
            and node.origin.helper_node is weight.helper_node
            and ir.depends_on_policy(node)
        ):
            # Here, not at the top: see ``_written_apart``.
            from kllint.analysis.syntax import assigned_names

            named = assigned_names(node.origin.statement)
            return node if any(has_words(name, KL_TERM_WORDS) for name in named) else None
    return None


def _path(node: ir.Node, target: ir.Node, without: set[int] | None = None) -> list[ir.Node]:
    """The nodes from ``node`` down to ``target``, both included (empty when
    ``target`` is not below ``node``). Subtrees are shared (a DAG): each one
    without the target is searched once."""
    without = set() if without is None else without
    if node is target:
        return [node]
    for child in node.children():
        if id(child) in without:
            continue
        below = _path(child, target, without)
        if below:
            return [node, *below]
        without.add(id(child))
    return []


_PROFILES: dict[tuple[object, ...], GradientProfile | None] = {}


def _behaviour_by_contrast(term: ir.Node) -> ir.Node:
    """``exp(new_logprobs - logprobs)``: when a term holds a policy log-prob
    named as the current one (new, current) and others named plainly, the
    plain ones are the rollout's (behaviour policy, no gradient). Only at the
    current one's level: a ratio compares like with like, and a sequence's
    log-prob summed from the current token log-probs (``seq_logprob``, the
    score of ``sg(seq_kl) * seq_logprob``) is the current policy's."""
    names = _names(term, Role.POLICY_LOGP)
    current = [n for n in names if has_words(n, CURRENT_WORDS)]
    if not current or len(current) == len(names):
        return term
    # Only a current one with gradient: ``new`` computed under ``no_grad``
    # for a KL reward says nothing of the loss's log-probs that weight it.
    live = _with_gradient(term)
    current = [n for n in current if n in live]
    if not current:
        return term
    levels = {a.level for a in term.atoms() if a.role is Role.POLICY_LOGP and a.name in current}
    mapping: dict[int, ir.Node] = {
        id(a): ir.Atom(Role.OLD_LOGP, a.name, a.level, origin=a.origin)
        for a in term.atoms()
        if a.role is Role.POLICY_LOGP and a.name not in current and a.level in levels
    }
    return ir.substitute(term, mapping)


def _with_gradient(term: ir.Node) -> set[str]:
    """The names of the policy log-probs a term reaches without a detach
    (each shared subexpression visited once: ``kl = kl + kl`` repeated)."""
    found: set[str] = set()
    seen: set[int] = set()
    stack = [term]
    while stack:
        node = stack.pop()
        if id(node) in seen or (isinstance(node, ir.Unary) and node.op == "detach"):
            continue
        seen.add(id(node))
        if isinstance(node, ir.Atom) and node.role is Role.POLICY_LOGP:
            found.add(node.name)
        stack.extend(node.children())
    return found


def _estimator_name(focus: ir.Node) -> str:
    key = _gradient_key(focus)
    if key not in _ESTIMATOR_NAMES:
        _ESTIMATOR_NAMES[key] = estimator_name(focus)
    return _ESTIMATOR_NAMES[key]


_ESTIMATOR_NAMES: dict[tuple[object, ...], str] = {}


def _gradient_key(term: ir.Node) -> tuple[object, ...]:
    """What a term's gradient depends on: its gradient structure, and which
    of its coefficients are numerical guards (``log(p + eps)``, valued as a
    tiny number where another coefficient is any number), which the
    structure, blind to names, does not tell apart."""
    guards = tuple(
        i
        for i, atom in enumerate(term.atoms())
        if atom.role is Role.COEFFICIENT and names_a_guard(atom.name)
    )
    return (ir.gradient_structure(term), guards)


def profile_of(term: ir.Node) -> GradientProfile | None:
    """A term's gradient profile, None where it cannot be classified.
    Alternatives of unrelated branches, and the same estimator in another
    function, repeat one gradient: computed once per gradient structure."""
    if ir.depends_on_policy(term) and _opaque_offset(term):
        return None  # (a term without gradient has none whatever the values)
    key = _gradient_key(term)
    if key not in _PROFILES:
        try:
            _PROFILES[key] = profile(term)
        except Unsupported:
            _PROFILES[key] = None
    return _PROFILES[key]


def _opaque_offset(term: ir.Node) -> bool:
    """A value kllint cannot read added to or subtracted from something in
    the term (``loss_mask * (1 - torch.cat(...))``, a turn-end mask). As a
    factor it is a positive weight that leaves the gradient's direction
    alone; as an offset its sign and size decide it, so no verdict."""
    stack, seen = [term], set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, ir.Binary) and node.op == "div":
            stack.append(node.left)  # a divisor (``k - 1`` in RLOO's baseline) normalises
            continue
        if (
            isinstance(node, ir.Binary)
            and node.op in ("add", "sub")
            and any(
                isinstance(side, ir.Opaque) and not _starts_at_zero(side)
                for side in (node.left, node.right)
            )
        ):
            return True
        stack.extend(node.children())
    return False


def _starts_at_zero(node: ir.Opaque) -> bool:
    # ``total = torch.zeros(())`` then ``total = total + kl``: the running
    # total's start, a constant that adds nothing.
    return node.reason in (".zeros()", ".zeros_like()")


def build_site(
    term: ir.Node, sink: str, strong: bool, branch: str, fallback: ir.Origin
) -> KLSite | None:
    term = _behaviour_by_contrast(term)
    gradient_profile = profile_of(term)
    if gradient_profile is None:
        return None
    focus = focus_of(term)
    # An importance-weighted estimate differentiated as a loss is one
    # estimator: it is written where the weight multiplies it (often a line
    # below the plain estimate). A KL reward the PPO ratio weighs through the
    # advantages stays where it is computed.
    path = _path(term, focus)
    weighted = (
        _ratio_weighted(term, focus)
        if ir.depends_on_policy(focus) and not _detached_on_the_way(path)
        else None
    )
    written = focus
    if weighted is not None and _written_apart(term, weighted):
        written = weighted
    else:
        # (Also for a term without gradient: ``kl_term = kl_to_go * logp``
        # written under ``no_grad`` is the estimate that has none.)
        written = _score_function(path) or focus
    handed_back = next((n for n in path if n.origin is not None and n.origin.handed_back), None)
    if handed_back is not None and written is focus:
        # (A score-function line named as the penalty is the estimate, even
        # when its weight came back from a helper.)
        written = handed_back
    origin = written.origin or term.origin or fallback
    if origin.reported_by_helper:
        return None
    estimate = focus.origin or term.origin or fallback
    return KLSite(
        term=term,
        focus=focus,
        origin=origin,
        sink=sink,
        strong_sink=strong,
        profile=gradient_profile,
        estimator=origin.estimate or _estimator_name(focus),
        branch=branch,
        estimate_node=estimate.cst_node,
    )


def length_normalised(term: ir.Node) -> bool:
    """The term divides each sequence by its own length (``masked_mean`` over
    time): on variable lengths a weight that depends on the sample, so the
    expectation is none of the targets (k1 becomes a length reward)."""
    for node in term.walk():
        if (
            isinstance(node, ir.Reduce)
            and node.axis is ir.Axis.TIME
            and node.kind == "mean"
            and node.mask is not None
        ):
            return True
        if isinstance(node, ir.Binary) and node.op == "div" and _sequence_length(node.right):
            return True
    return False


def _sequence_length(node: ir.Node) -> bool:
    """``mask.sum(-1)``: a sum over time of a mask, each sequence's length."""
    return any(
        isinstance(n, ir.Reduce) and n.axis is ir.Axis.TIME and n.arg.has_role(ir.Role.MASK)
        for n in node.walk()
    )
