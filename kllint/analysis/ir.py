"""The KL expression IR: what every stage of kllint (classification, the torch
harness, fixes) works on instead of source spellings.

A KL term is a small tree over a few *atoms* (the policy's log-prob, the
reference's, the behaviour policy's, masks, coefficients) and a closed set of
operations. ``torch.exp(ref - logp) - (ref - logp) - 1`` and
``ratio - ratio.log() - 1`` with ``ratio = (ref - logp).exp()`` lower to trees
with the same gradient, and that gradient is what the rules judge.

Shapes follow the training code: token-level atoms are ``[B, T]``; a
``Reduce`` over ``time`` gives ``[B]`` (one value per sequence), over ``all``
a scalar. The harness evaluates the tree on tensors of an enumerated tabular
policy; ``kllint.analysis.gradient`` evaluates it on dual numbers.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field


class Role(enum.Enum):
    """What an atom is in the KL computation."""

    POLICY_LOGP = "policy_logp"
    """log pi_theta(y_t | y_<t): differentiable, sampled from (on-policy)."""
    REFERENCE_LOGP = "reference_logp"
    """log pi_ref(y_t | y_<t): frozen."""
    OLD_LOGP = "old_logp"
    """log-prob under the behaviour policy that sampled the rollout: detached,
    equal in value to ``policy_logp`` on fresh samples."""
    MASK = "mask"
    """1 on response tokens, 0 on padding."""
    ADVANTAGE = "advantage"
    """A per-token weight computed without gradient (advantage, return, reward)."""
    COEFFICIENT = "coefficient"
    """A scalar without gradient: beta, kl_coef, a config value."""


class Level(enum.Enum):
    TOKEN = "token"
    SEQUENCE = "sequence"
    # A log-prob for every vocabulary entry at each position (``log_softmax``
    # before the gather). Only its expectation over the vocabulary, an exact
    # per-position divergence, enters a KL term (see the interpreter).
    DISTRIBUTION = "distribution"


class Axis(enum.Enum):
    TIME = "time"  # over the tokens of each sequence: [B, T] -> [B]
    BATCH = "batch"  # over sequences: [B, T] -> [T], [B] -> []
    ALL = "all"  # over everything: -> []


@dataclass(eq=False)
class Origin:
    """Where an IR node came from, for messages. ``line``/``column`` are 1-based.

    Positions are filled in only for the nodes a finding reports, after the
    analysis (LibCST's position metadata costs about twice a parse), so an
    origin starts with the LibCST node it came from and zeros."""

    path: str
    line: int = 0
    column: int = 0
    end_line: int = 0
    end_column: int = 0
    code: str = ""
    helper: str | None = None  # "function (path:line)" when lowered from a helper's body
    cst_node: object = field(default=None, repr=False)
    helper_node: object = field(default=None, repr=False)  # the helper's FunctionDef
    statement: object = field(default=None, repr=False)  # the statement the node is in
    # The function of the linted file the node is in: positions are computed
    # over that function's code, not the whole module's.
    function: object = field(default=None, repr=False)
    notes: list[str] = field(default_factory=list)  # e.g. how a selector was resolved
    # What the code computes here when the IR holds a surrogate with the same
    # expected gradient instead (an exact divergence over the vocabulary).
    estimate: str | None = None
    # What kllint assumed here because it could not follow the code (an
    # unresolved callee taken for a reduction), said in the finding's notes.
    assumed: str | None = None
    # A call of a loss function of another file: what it computes is that
    # file's finding (one bug, one finding), not the caller's.
    reported_by_helper: bool = False
    # A helper's return that is one of its arguments handed back (a k1 branch
    # returning ``log_ratio``): the estimate is the call, wherever the
    # argument was computed.
    handed_back: bool = False


@dataclass(frozen=True, eq=False)
class Node:
    origin: Origin | None = field(default=None, kw_only=True, compare=False, repr=False)

    def children(self) -> tuple[Node, ...]:
        return ()

    def walk(self) -> Iterator[Node]:
        """Every node below, each once, in pre-order. Trees share subtrees
        (``kl = kl + kl`` makes a DAG): walking them as trees is exponential.
        A stack, not recursion: a 1,000-term sum is 1,000 levels deep."""
        seen: set[int] = set()
        stack: list[Node] = [self]
        while stack:
            node = stack.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            yield node
            stack.extend(reversed(node.children()))

    def atoms(self) -> tuple[Atom, ...]:
        """The atoms below, each once. Kept on the node (a node never
        changes): the analysis asks a term for its roles many times."""
        known: tuple[Atom, ...] | None = self.__dict__.get("_atoms")
        if known is None:
            known = tuple(node for node in self.walk() if isinstance(node, Atom))
            object.__setattr__(self, "_atoms", known)
        return known

    def has_role(self, role: Role) -> bool:
        return any(atom.role is role for atom in self.atoms())


@dataclass(frozen=True, eq=False)
class Atom(Node):
    role: Role
    name: str  # the user's spelling, for messages and printed fixes
    level: Level = Level.TOKEN
    # Evidence that it is per token of a sequence (computed from logits cut
    # along time), whatever its name says.
    per_token: bool = field(default=False, compare=False)
    # A coefficient's configured default and where it is given (``beta: float
    # = 1.0`` in a config class): read only by a comparison that picks a mode
    # (``if beta == 1``); as a factor it stays a coefficient of any value.
    default: tuple[float, str] | None = field(default=None, compare=False)


@dataclass(frozen=True, eq=False)
class Const(Node):
    value: float


UNARY_OPS = ("neg", "exp", "log", "expm1", "log1p", "square", "abs", "sqrt", "detach")


@dataclass(frozen=True, eq=False)
class Unary(Node):
    op: str  # one of UNARY_OPS
    arg: Node

    def children(self) -> tuple[Node, ...]:
        return (self.arg,)


# max/min are elementwise (PPO's clipped objective): the gradient is the one
# of the larger (smaller) operand.
BINARY_OPS = ("add", "sub", "mul", "div", "pow", "max", "min")


@dataclass(frozen=True, eq=False)
class Binary(Node):
    op: str  # one of BINARY_OPS
    left: Node
    right: Node

    def children(self) -> tuple[Node, ...]:
        return (self.left, self.right)


@dataclass(frozen=True, eq=False)
class Clamp(Node):
    arg: Node
    low: float | None
    high: float | None

    def children(self) -> tuple[Node, ...]:
        return (self.arg,)


@dataclass(frozen=True, eq=False)
class Reduce(Node):
    """``kind`` is ``sum`` or ``mean``. With a ``mask`` the reduction is masked:
    ``sum(x * mask)`` or ``sum(x * mask) / sum(mask)`` over the same axis."""

    kind: str
    axis: Axis
    arg: Node
    mask: Node | None = None

    def children(self) -> tuple[Node, ...]:
        return (self.arg,) if self.mask is None else (self.arg, self.mask)


@dataclass(frozen=True, eq=False)
class CumSum(Node):
    """Cumulative sum over time; ``reverse`` gives the reward-to-go
    ``G_t = sum_{s >= t} x_s``."""

    arg: Node
    reverse: bool
    # ``ret = r + gamma * ret``: G_t = x_t + discount * G_{t+1}; None for 1.
    # Not a child: it weighs the scan, it is not summed by it.
    discount: Node | None = None

    def children(self) -> tuple[Node, ...]:
        return (self.arg,)


@dataclass(frozen=True, eq=False)
class Opaque(Node):
    """A value the IR cannot represent (an unknown call, a comprehension...).
    It carries no gradient through the policy as far as kllint can tell, and
    the harness refuses to confirm a term that contains one."""

    reason: str
    # A comparison's truth values (``input_ids != image_token_id``): whatever
    # else it is, it carries no gradient.
    gradient_free: bool = field(default=False, compare=False)
    # Of a sum over the vocabulary kllint does not read as a divergence
    # (``(pi.probs * ref.logits).sum(-1)``, an entropy): what is summed. The
    # sum is linear: two such sums added up may be one it reads.
    summand: Node | None = field(default=None, compare=False)


# Constructors that fold the trivial cases, so that lowered trees stay small.


def neg(x: Node, origin: Origin | None = None) -> Node:
    if isinstance(x, Const):
        return Const(-x.value, origin=origin)
    return Unary("neg", x, origin=origin)


def binary(op: str, left: Node, right: Node, origin: Origin | None = None) -> Node:
    # ``kl_term - entropy_term`` where the entropy term is ``torch.tensor(0.0)``
    # on one branch: the KL term is what it was, reported where it was written.
    if op in ("add", "sub") and isinstance(right, Const) and right.value == 0:
        return left
    if op == "add" and isinstance(left, Const) and left.value == 0:
        return right
    if op == "add":
        to_come = _still_to_come(left, right, origin)
        if to_come is not None:
            return to_come
    if isinstance(left, Const) and isinstance(right, Const):
        a, b = left.value, right.value
        try:
            value = {
                "add": a + b,
                "sub": a - b,
                "mul": a * b,
                "div": a / b,
                "pow": a**b,
                "max": max(a, b),
                "min": min(a, b),
            }[op]
        except (ZeroDivisionError, OverflowError, ValueError):
            return Binary(op, left, right, origin=origin)
        if isinstance(value, complex):
            return Binary(op, left, right, origin=origin)
        return Const(float(value), origin=origin)
    return Binary(op, left, right, origin=origin)


def _still_to_come(left: Node, right: Node, origin: Origin | None) -> Node | None:
    """``total - running + x`` with ``running`` the running sum of ``x`` over
    time and ``total`` its value at each sequence's last token
    (``csum[ends][seg]`` over packed tokens, ``running[:, -1:]``): the sum of
    ``x`` from each token to the end of its sequence, a reverse cumulative
    sum (detached where any part is)."""
    if not (isinstance(left, Binary) and left.op == "sub"):
        return None

    def bare(node: Node) -> Node:
        return node.arg if isinstance(node, Unary) and node.op == "detach" else node

    parts = [left.left, left.right, right]
    total, running, x = map(bare, parts)
    if not (
        isinstance(total, Reduce)
        and total.kind == "sum"
        and total.axis is Axis.TIME
        and total.mask is None
        and isinstance(running, CumSum)
        and not running.reverse
        and running.discount is None
        and structure(bare(total.arg)) == structure(bare(running.arg)) == structure(bare(x))
    ):
        return None
    to_come = CumSum(bare(x), reverse=True, origin=origin)
    detached = any(bare(p) is not p for p in (*parts, x))
    return detach(to_come, origin) if detached else to_come


def policy_gradient(weight: Node, logp: Node, origin: Origin | None = None) -> Node:
    """``-(weight * logp)``: the loss of a policy gradient weighted by
    rewards, returns or advantages, as kllint stands in for a loss it cannot
    read (whatever its clipping, its expected gradient on-policy)."""
    return neg(Binary("mul", weight, logp, origin=origin), origin)


def detach(x: Node, origin: Origin | None = None) -> Node:
    if isinstance(x, (Const, Opaque)) or (isinstance(x, Unary) and x.op == "detach"):
        return x
    return Unary("detach", x, origin=origin)


def is_detached(x: Node) -> bool:
    return isinstance(x, Unary) and x.op == "detach"


def depends_on_policy(x: Node) -> bool:
    """True if ``x`` has a gradient path to ``policy_logp`` (no detach between)."""
    if isinstance(x, Atom):
        return x.role is Role.POLICY_LOGP
    if isinstance(x, Unary) and x.op == "detach":
        return False
    return any(depends_on_policy(c) for c in x.children())


# New tensors of constants (``torch.zeros(())``, the start of a running
# total; ``torch.ones(n)``, a mask): kept opaque, but without a gradient.
CONSTANT_TENSORS = frozenset({"zeros", "ones", "zeros_like", "ones_like", "full"})
_NEW_CONSTANT_TENSORS = frozenset(f".{name}()" for name in CONSTANT_TENSORS)


def is_new_constant_tensor(node: Node) -> bool:
    return isinstance(node, Opaque) and node.reason in _NEW_CONSTANT_TENSORS


def has_unknown_gradient(x: Node) -> bool:
    """An opaque value outside any detach, other than a new tensor of
    constants: it may carry a gradient kllint cannot see."""
    if isinstance(x, Opaque):
        return not (is_new_constant_tensor(x) or x.gradient_free)
    if isinstance(x, Unary) and x.op == "detach":
        return False
    return any(has_unknown_gradient(c) for c in x.children())


def has_unknown_gradient_but_normalisers(x: Node) -> bool:
    """As ``has_unknown_gradient``, but a value kllint cannot read that
    divides (``/ loss_denom``, ``/ n_tokens_global``) is a normaliser: a
    count of tokens or samples, not a path to the policy."""
    if isinstance(x, Opaque):
        return not (is_new_constant_tensor(x) or x.gradient_free)
    if isinstance(x, Unary) and x.op == "detach":
        return False
    if isinstance(x, Binary) and x.op == "div" and isinstance(x.right, Opaque):
        return has_unknown_gradient_but_normalisers(x.left)
    return any(has_unknown_gradient_but_normalisers(c) for c in x.children())


def detached_as_a_whole(x: Node) -> bool:
    """``loss.detach()`` (up to sign and scaling): a value returned for logging."""
    while True:
        if isinstance(x, Unary) and x.op == "neg":
            x = x.arg
        elif isinstance(x, Binary) and x.op in ("mul", "div") and not depends_on_policy(x.right):
            if is_detached(x.left):
                return True
            x = x.left
        elif isinstance(x, Binary) and x.op in ("add", "sub"):
            # ``total = total + loss.detach()`` from ``torch.zeros(())``: a
            # running total kept for logging.
            sides = (x.left, x.right)
            return any(detached_as_a_whole(s) for s in sides) and all(
                detached_as_a_whole(s) or not s.atoms() for s in sides
            )
        else:
            return is_detached(x)


def render(x: Node) -> str:
    """A compact formula for messages, in the user's names."""
    if isinstance(x, Atom):
        return x.name
    if isinstance(x, Const):
        v = x.value
        return str(int(v)) if float(v).is_integer() else f"{v:g}"
    if isinstance(x, Opaque):
        return f"<{x.reason}>"
    if isinstance(x, Unary):
        if x.op == "neg":
            return f"-{_paren(x.arg)}"
        if x.op == "detach":
            return f"sg({render(x.arg)})"
        return f"{x.op}({render(x.arg)})"
    if isinstance(x, Binary):
        if x.op in ("max", "min"):
            return f"{x.op}({render(x.left)}, {render(x.right)})"
        sym = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "**"}[x.op]
        return f"{_paren(x.left)} {sym} {_paren(x.right)}"
    if isinstance(x, Clamp):
        return f"clamp({render(x.arg)}, {x.low}, {x.high})"
    if isinstance(x, Reduce):
        masked = ", mask" if x.mask is not None else ""
        return f"{x.kind}_{x.axis.value}({render(x.arg)}{masked})"
    if isinstance(x, CumSum):
        discount = "" if x.discount is None else f", discount={render(x.discount)}"
        return f"{'reverse_' if x.reverse else ''}cumsum({render(x.arg)}{discount})"
    return type(x).__name__


def _paren(x: Node) -> str:
    text = render(x)
    return f"({text})" if isinstance(x, Binary) else text


_SHAPES: dict[int, tuple[Node, tuple[object, ...]]] = {}


def structure(node: Node) -> tuple[object, ...]:
    """A hashable key: equal for trees with the same atoms and operations."""
    cached = _SHAPES.get(id(node))
    if cached is not None and cached[0] is node:
        return cached[1]
    shape = _shape_uncached(node)
    _SHAPES[id(node)] = (node, shape)
    return shape


def gradient_structure(node: Node) -> tuple[object, ...]:
    """A hashable key: equal for trees the gradient analysis cannot tell
    apart (the same roles and operations, whatever the values are named)."""
    cached = _GRADIENT_SHAPES.get(id(node))
    if cached is not None and cached[0] is node:
        return cached[1]
    shape = _shape_uncached(node, named=False)
    _GRADIENT_SHAPES[id(node)] = (node, shape)
    return shape


_GRADIENT_SHAPES: dict[int, tuple[Node, tuple[object, ...]]] = {}


def clear_caches() -> None:
    _SHAPES.clear()
    _GRADIENT_SHAPES.clear()


def _shape_uncached(node: Node, named: bool = True) -> tuple[object, ...]:
    own: tuple[object, ...]
    if isinstance(node, Atom):
        own = (node.role, node.name, node.level) if named else (node.role, node.level)
    elif isinstance(node, Const):
        own = (node.value,)
    elif isinstance(node, Opaque):
        own = (node.reason,) if named else ()
    elif isinstance(node, (Unary, Binary)):
        own = (node.op,)
    elif isinstance(node, Clamp):
        own = (node.low, node.high)
    elif isinstance(node, Reduce):
        own = (node.kind, node.axis, node.mask is not None)
    elif isinstance(node, CumSum):
        own = (node.reverse, None if node.discount is None else structure(node.discount))
    else:
        own = ()
    # Children by an interned number: a DAG (``kl = kl + kl``) has a tree
    # shape exponential in its size, and so would hashing nested tuples be.
    shape = structure if named else gradient_structure
    children = tuple(_interned(shape(c)) for c in node.children())
    return (type(node).__name__, own, children)


# Shape -> number, for the life of the process (keys of cached profiles are
# built from these numbers, so they are never reused).
_INTERNED: dict[tuple[object, ...], int] = {}


def _interned(shape: tuple[object, ...]) -> int:
    return _INTERNED.setdefault(shape, len(_INTERNED))


def substitute(node: Node, mapping: dict[int, Node]) -> Node:
    """``node`` with the subtrees whose ids are in ``mapping`` replaced."""
    if id(node) in mapping:
        return mapping[id(node)]
    children = node.children()
    if not children:
        return node
    new = [substitute(child, mapping) for child in children]
    if all(a is b for a, b in zip(children, new)):
        return node
    if isinstance(node, Unary):
        return Unary(node.op, new[0], origin=node.origin)
    if isinstance(node, Binary):
        return Binary(node.op, new[0], new[1], origin=node.origin)
    if isinstance(node, Clamp):
        return Clamp(new[0], node.low, node.high, origin=node.origin)
    if isinstance(node, Reduce):
        return Reduce(
            node.kind,
            node.axis,
            new[0],
            new[1] if node.mask is not None else None,
            origin=node.origin,
        )
    if isinstance(node, CumSum):
        return CumSum(new[0], node.reverse, node.discount, origin=node.origin)
    return node


def contains(node: Node, target: Node) -> bool:
    return any(n is target for n in node.walk())


def reaches(node: Node, found: Callable[[Node], bool], stop: Callable[[Node], bool]) -> bool:
    """Whether a node ``found`` accepts lies below ``node`` on a path that
    passes no node ``stop`` accepts (a stack, not recursion: sums can be deep)."""
    seen: set[int] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        if id(current) in seen or stop(current):
            continue
        seen.add(id(current))
        if found(current):
            return True
        stack.extend(current.children())
    return False


def settings_only(node: Node, *, unread_names: bool = False) -> bool:
    """Literals and coefficients, in arithmetic: nothing a gradient flows
    through. ``unread_names``: also a name kllint has no value for (``step``),
    not a call's result, which may be a tensor."""
    return all(
        isinstance(leaf, (Const, Binary, Unary))
        or (isinstance(leaf, Atom) and leaf.role is Role.COEFFICIENT)
        or (unread_names and isinstance(leaf, Opaque) and "(" not in leaf.reason)
        for leaf in node.walk()
    )


def is_batch_mean(node: Node) -> bool:
    """``sum(x * mask) / sum(mask)`` over the whole batch (a whitening's mean
    and variance): in a detached weight, over a large batch, a constant."""

    def batch_sum(side: Node) -> bool:
        if isinstance(side, Clamp):  # ``mask.sum().clamp(min=1.0)``
            side = side.arg
        return isinstance(side, Reduce) and side.kind == "sum" and side.axis is not Axis.TIME

    if not (isinstance(node, Binary) and node.op == "div" and batch_sum(node.left)):
        return False
    # A count kllint cannot read (``mask.sum()`` of a mask of ones) divides a
    # sum over every token of every sample.
    return batch_sum(node.right) or (
        isinstance(node.right, Opaque)
        and isinstance(node.left, Reduce)
        and node.left.axis is Axis.ALL
    )


def is_batch_statistic(node: Node) -> bool:
    """A whitening's parts: a detached batch mean, or a scale made of one
    (``torch.rsqrt(var + eps)``, ``1 / (std + eps)``). (A batch mean that
    carries gradient is a loss: ``beta * masked_mean(kl, mask)``.)"""
    detached = False
    while True:
        if detached and is_batch_mean(node):
            return True
        if isinstance(node, Unary) and node.op in ("detach", "sqrt"):
            detached = detached or node.op == "detach"
            node = node.arg
        elif (
            isinstance(node, Binary)
            and node.op in ("add", "sub", "mul", "div")
            and isinstance(node.left, Const)
        ):
            node = node.right
        elif (
            isinstance(node, Binary)
            and node.op in ("add", "sub", "mul", "div", "pow")
            and isinstance(node.right, Const)
        ):
            node = node.left
        else:
            return False
