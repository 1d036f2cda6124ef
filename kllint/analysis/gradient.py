"""How kllint recognises an estimator: by the gradient autograd would give it.

A surrogate loss ``L`` built from per-token log-ratios ``x_t = logp_t - ref_t``
has autograd gradient ``sum_t c_t(x) * grad logp_t``. Its expectation under
``y ~ pi`` depends only on ``c``:

* a coefficient that is a function of the token's own ``x_t``,
  ``c_t = b + a1 * x_t + a2 * exp(-x_t)``, has expectation
  ``a1 * grad KL_t(pi||pi_ref) - a2 * grad KL_t(pi_ref||pi)``, because
  ``E[grad logp] = 0``, ``E[x grad logp] = grad KL(pi||pi_ref)`` and
  ``E[exp(-x) grad logp] = sum_y pi_ref(y) grad log pi(y) = -grad KL(pi_ref||pi)``;
* terms of later tokens ``s > t`` credit token ``t`` with the KL it causes
  downstream (the reward-to-go) when they are ``a1 * x_s`` (or ``a1 * k3_s``,
  whose conditional mean is the same); ``exp(-x_s)`` has conditional mean 1
  and adds nothing; ``x_s ** 2`` is not a KL and biases it;
* terms of earlier tokens ``s < t`` act as a baseline: zero expected gradient.

So k1 (``c = 1``) has zero expected gradient, k3 (``c = 1 - exp(-x)``)
follows KL(pi_ref||pi), k2 and the score function (``c = x``) follow
KL(pi||pi_ref) per token, and only a reward-to-go (future coefficients equal
to the local one) follows the sequence KL. The coefficients are read off by
evaluating the IR on dual numbers at a few dozen points and solving a small
least-squares problem: pure Python, no torch, a few milliseconds per term.
"""

from __future__ import annotations

import enum
import math
import random
from dataclasses import dataclass

from kllint.analysis import ir
from kllint.analysis.ir import Axis, Level, Role
from kllint.analysis.policy_words import GUARD_VALUE, names_a_guard

# Coefficients and opaque weights only scale a term; not 1, so that an
# expression such as ``(k - 1)`` in a leave-one-out baseline stays finite.
_WEIGHT = 1.3
HORIZON = 3  # tokens per probe trajectory: enough for a past, a present and two futures
PROBES = 24
_TOL = 1e-6


class Unsupported(Exception):
    """The term contains something dual evaluation cannot follow."""


# ---------------------------------------------------------------- dual numbers


@dataclass
class Dual:
    value: float
    grad: list[float]  # d value / d policy_logp_t, t = 0..HORIZON-1

    @staticmethod
    def const(value: float, n: int) -> Dual:
        return Dual(value, [0.0] * n)


def _lift(fn_value: float, fn_deriv: float, a: Dual) -> Dual:
    return Dual(fn_value, [fn_deriv * g for g in a.grad])


def _dual_binary(op: str, a: Dual, b: Dual) -> Dual:
    if op == "add":
        return Dual(a.value + b.value, [x + y for x, y in zip(a.grad, b.grad)])
    if op == "sub":
        return Dual(a.value - b.value, [x - y for x, y in zip(a.grad, b.grad)])
    if op == "mul":
        return Dual(a.value * b.value, [x * b.value + a.value * y for x, y in zip(a.grad, b.grad)])
    if op == "div":
        if b.value == 0:
            raise Unsupported("division by zero")
        v = a.value / b.value
        return Dual(v, [(x - v * y) / b.value for x, y in zip(a.grad, b.grad)])
    if op in ("max", "min"):
        # Ties (the clipped and unclipped PPO objectives at ratio = 1) take
        # the first operand, the unclipped one.
        first = a.value >= b.value if op == "max" else a.value <= b.value
        return a if first else b
    if op == "pow":
        if not any(b.grad):
            if a.value == 0 and b.value < 1:
                raise Unsupported("pow at zero")
            if a.value < 0 and not float(b.value).is_integer():
                raise Unsupported("fractional power of a negative number")
            v = a.value**b.value
            d = b.value * a.value ** (b.value - 1) if b.value != 0 else 0.0
            return _lift(v, d, a)
        if a.value <= 0:
            raise Unsupported("pow with a variable exponent")
        v = a.value**b.value
        la = math.log(a.value)
        return Dual(v, [v * (b.value * x / a.value + la * y) for x, y in zip(a.grad, b.grad)])
    raise Unsupported(op)


def _dual_unary(op: str, a: Dual) -> Dual:
    v = a.value
    try:
        if op == "neg":
            return _lift(-v, -1.0, a)
        if op == "exp":
            e = math.exp(v)
            return _lift(e, e, a)
        if op == "expm1":
            return _lift(math.expm1(v), math.exp(v), a)
        if op == "log":
            return _lift(math.log(v), 1.0 / v, a)
        if op == "log1p":
            return _lift(math.log1p(v), 1.0 / (1.0 + v), a)
        if op == "square":
            return _lift(v * v, 2 * v, a)
        if op == "abs":
            return _lift(abs(v), 1.0 if v >= 0 else -1.0, a)
        if op == "sqrt":
            return _lift(math.sqrt(v), 0.5 / math.sqrt(v), a)
        if op == "detach":
            return Dual.const(v, len(a.grad))
    except (ValueError, ZeroDivisionError, OverflowError) as exc:
        raise Unsupported(f"{op} outside its domain") from exc
    raise Unsupported(op)


# A value during evaluation: one Dual per token (token level) or a single Dual
# (one per sequence, after a reduction over time).
Value = list[Dual]


@dataclass
class _Point:
    log_ratio: list[float]  # x_t
    reference_logp: list[float]
    advantage: list[float]


Memo = dict[tuple[int, bool], tuple[Value, bool]]


def _evaluate(
    node: ir.Node, point: _Point, memo: Memo, detached: bool = False
) -> tuple[Value, bool]:
    """Returns (values, per_token). ``detached``: inside a stop-gradient."""
    key = (id(node), detached)
    if key in memo:
        return memo[key]
    result = _evaluate_uncached(node, point, memo, detached)
    memo[key] = result
    return result


def _broadcast(a: tuple[Value, bool], b: tuple[Value, bool]) -> tuple[Value, Value, bool]:
    (va, ta), (vb, tb) = a, b
    if ta == tb:
        return va, vb, ta
    n = len(va) if ta else len(vb)
    return (va if ta else va * n), (vb if tb else vb * n), True


def _evaluate_uncached(
    node: ir.Node, point: _Point, memo: Memo, detached: bool
) -> tuple[Value, bool]:
    n = len(point.log_ratio)
    if isinstance(node, ir.Const):
        return [Dual.const(node.value, n)], False
    if isinstance(node, ir.Atom):
        if node.role is Role.MASK and node.level is Level.SEQUENCE:
            return [Dual.const(1.0, n)], False  # a sample mask: the sequence counts
        if node.role is Role.COEFFICIENT and names_a_guard(node.name):
            return [Dual.const(GUARD_VALUE, n)], False  # ``log(p + eps)``: the log-prob
        values = _atom_values(node.role, point)
        if node.level is Level.SEQUENCE:
            return [_total(values)], False
        return values, True
    if isinstance(node, ir.Unary):
        values, per_token = _evaluate(node.arg, point, memo, detached or node.op == "detach")
        return [_dual_unary(node.op, d) for d in values], per_token
    if isinstance(node, ir.Binary):
        if detached and ir.is_batch_mean(node):
            # ``sum(x * mask) / sum(mask)`` over the whole batch (a whitening's
            # mean and variance): over a large batch, a constant.
            return [Dual.const(_WEIGHT, n)], False
        left, right, per_token = _broadcast(
            _evaluate(node.left, point, memo, detached),
            _evaluate(node.right, point, memo, detached),
        )
        return [_dual_binary(node.op, a, b) for a, b in zip(left, right)], per_token
    if isinstance(node, ir.Clamp):
        values, per_token = _evaluate(node.arg, point, memo, detached)
        return [_clamped(d, node.low, node.high, n) for d in values], per_token
    if isinstance(node, ir.Reduce):
        return _reduced(node, point, memo, detached)
    if isinstance(node, ir.CumSum):
        return _cumulative(node, point, memo, detached)
    if isinstance(node, ir.Opaque):
        # An opaque value carries no gradient through the policy as far as
        # kllint can tell: a weight (see ir.Opaque).
        return [Dual.const(_WEIGHT, n)], False
    raise Unsupported(type(node).__name__)


def _total(values: Value) -> Dual:
    return Dual(sum(d.value for d in values), [sum(col) for col in zip(*(d.grad for d in values))])


def _clamped(d: Dual, low: float | None, high: float | None, n: int) -> Dual:
    if low is not None and d.value < low:
        return Dual.const(low, n)
    if high is not None and d.value > high:
        return Dual.const(high, n)
    return d


def _reduced(node: ir.Reduce, point: _Point, memo: Memo, detached: bool) -> tuple[Value, bool]:
    n = len(point.log_ratio)
    values, per_token = _evaluate(node.arg, point, memo, detached)
    baseline = (
        node.kind == "mean" and node.axis is Axis.BATCH and not ir.depends_on_policy(node.arg)
    )
    if node.axis is not Axis.TIME and (detached or baseline):
        # A batch statistic in a detached weight (a whitened advantage, a
        # group baseline; also a group's mean of rewards made of detached
        # log-probs, ``rewards.view(-1, n).mean(dim=1)``, with no detach
        # around it). A mean over a large batch is a constant that does
        # not depend on this sample; a sum holds this sample once, plus a
        # constant: (sum(r) - r) / (k - 1), the leave-one-out baseline,
        # does not depend on r.
        if node.kind == "mean":
            return [Dual.const(_WEIGHT, n)], False
        # Over the samples only (``returns.sum(dim=1)`` of ``[B, G, T]``),
        # each token's own value; over everything, the sample's total.
        by_token = per_token and node.axis is Axis.BATCH
        own = values if by_token or not per_token else [_total(values)]
        return [Dual(d.value + _WEIGHT, d.grad) for d in own], by_token
    if node.axis is Axis.BATCH or not per_token:
        return values, per_token
    weights = [1.0] * len(values)
    if node.mask is not None:
        mask_values, mask_per_token = _evaluate(node.mask, point, memo, detached)
        weights = [d.value for d in (mask_values if mask_per_token else mask_values * len(values))]
    total = Dual(
        sum(w * d.value for w, d in zip(weights, values)),
        [sum(w * d.grad[i] for w, d in zip(weights, values)) for i in range(n)],
    )
    if node.kind == "mean":
        count = sum(weights)
        if count == 0:
            raise Unsupported("empty mean")
        total = Dual(total.value / count, [g / count for g in total.grad])
    return [total], False


def _cumulative(node: ir.CumSum, point: _Point, memo: Memo, detached: bool) -> tuple[Value, bool]:
    n = len(point.log_ratio)
    values, per_token = _evaluate(node.arg, point, memo, detached)
    if not per_token:
        return values, per_token
    order = range(len(values) - 1, -1, -1) if node.reverse else range(len(values))
    out: list[Dual] = [Dual.const(0.0, n)] * len(values)
    running = Dual.const(0.0, n)
    for t in order:
        running = _dual_binary("add", running, values[t])
        out[t] = running
    return out, True


def _atom_values(role: Role, point: _Point) -> Value:
    n = len(point.log_ratio)

    def unit(t: int) -> list[float]:
        return [1.0 if i == t else 0.0 for i in range(n)]

    if role is Role.POLICY_LOGP:
        return [
            Dual(r + x, unit(t))
            for t, (r, x) in enumerate(zip(point.reference_logp, point.log_ratio))
        ]
    if role is Role.OLD_LOGP:
        # On fresh samples the behaviour policy is the policy, without gradient.
        return [Dual.const(r + x, n) for r, x in zip(point.reference_logp, point.log_ratio)]
    if role is Role.REFERENCE_LOGP:
        return [Dual.const(r, n) for r in point.reference_logp]
    if role is Role.MASK:
        return [Dual.const(1.0, n) for _ in range(n)]
    if role is Role.ADVANTAGE:
        return [Dual.const(a, n) for a in point.advantage]
    return [Dual.const(_WEIGHT, n) for _ in range(n)]  # coefficients: scale only


def gradient_coefficients(term: ir.Node, point: _Point) -> list[float]:
    """``c_t`` with ``grad L = sum_t c_t grad logp_t`` at one point; an
    unreduced per-token term counts as summed over tokens."""
    values, per_token = _evaluate(term, point, {})
    n = len(point.log_ratio)
    return [sum(d.grad[i] for d in values) for i in range(n)] if per_token else values[0].grad


def value_of(term: ir.Node, point: _Point) -> float:
    values, _ = _evaluate(term, point, {})
    return sum(d.value for d in values)


# ---------------------------------------------------------------- profiles


class Direction(enum.Enum):
    """What the expected gradient of one token's own coefficient follows."""

    NONE = "no-gradient"  # c == 0: nothing reaches the policy
    ZERO = "zero-expected-gradient"  # c constant: k1
    KL = "KL(pi||pi_ref)"  # c = a * x: k2, score function, importance-weighted k3
    REVERSE_KL = "KL(pi_ref||pi)"  # c = a * (1 - exp(-x)): k3
    K3_REWARD = "KL(pi||pi_ref) - KL(pi_ref||pi)"  # c = a * (exp(-x) + x - 1): k3 as a reward
    OTHER = "biased"  # anything else in the span, or outside it


class Credit(enum.Enum):
    """How later tokens' KL credits an earlier token (sequences only)."""

    NONE = "none"  # token-level: the partial gradient
    REWARD_TO_GO = "reward-to-go"  # future coefficients equal the local scale
    OTHER = "other"  # present but not a KL reward-to-go
    NOT_SEPARABLE = "not-separable"


@dataclass(frozen=True)
class GradientProfile:
    direction: Direction  # one token (bandit)
    scale: float  # a1 for KL, -a2 for REVERSE_KL, a for K3_REWARD
    credit: Credit  # sequences
    sequence_reverse_kl: bool  # c_t = a (1 - exp(-sum_s x_s)): k3 of the sequence log-ratio
    token_level: bool  # c_t depends on x_t alone: a per-token term summed over tokens

    @property
    def sequence_correct(self) -> bool:
        return (
            self.direction is Direction.KL and self.scale > 0 and self.credit is Credit.REWARD_TO_GO
        )


UNCLASSIFIED = GradientProfile(Direction.OTHER, 0.0, Credit.OTHER, False, False)


def _points(horizon: int, seed: int, *, task: bool = True) -> list[_Point]:
    """Probe points; ``task=False``: the task's advantages zero, so that only
    the KL part of a term is measured."""
    rng = random.Random(seed)
    points = []
    for _ in range(PROBES):
        log_ratio = [rng.uniform(-1.5, 1.5) for _ in range(horizon)]
        reference_logp = [rng.uniform(-2.5, -0.8) for _ in range(horizon)]
        advantage = [rng.uniform(-1.0, 1.0) for _ in range(horizon)]
        points.append(_Point(log_ratio, reference_logp, advantage if task else [0.0] * horizon))
    return points


def _least_squares(rows: list[list[float]], target: list[float]) -> tuple[list[float], float]:
    """Solve min ||A w - y|| by normal equations; returns (w, relative residual).
    Coefficients beyond floating point (``* 1e200 * 1e200``) fit nothing."""
    try:
        return _solve(rows, target)
    except (OverflowError, ZeroDivisionError):
        return [0.0] * len(rows[0]), math.inf


def _solve(rows: list[list[float]], target: list[float]) -> tuple[list[float], float]:
    k = len(rows[0])
    ata = [[sum(r[i] * r[j] for r in rows) for j in range(k)] for i in range(k)]
    aty = [sum(r[i] * y for r, y in zip(rows, target)) for i in range(k)]
    # Gaussian elimination with partial pivoting
    m = [row[:] + [b] for row, b in zip(ata, aty)]
    for col in range(k):
        pivot = max(range(col, k), key=lambda r: abs(m[r][col]))
        m[col], m[pivot] = m[pivot], m[col]
        if abs(m[col][col]) < 1e-12:
            continue
        for r in range(k):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [a - f * b for a, b in zip(m[r], m[col])]
    w = [m[i][k] / m[i][i] if abs(m[i][i]) >= 1e-12 else 0.0 for i in range(k)]
    residual = math.sqrt(
        sum((sum(a * b for a, b in zip(r, w)) - y) ** 2 for r, y in zip(rows, target))
    )
    scale = math.sqrt(sum(y * y for y in target)) or 1.0
    return w, residual / scale


def _local_features(x: float) -> list[float]:
    return [1.0, x, math.exp(-x), x * x]


def _classify_local(a1: float, a2: float, quad: float, constant: float) -> tuple[Direction, float]:
    big = max(abs(a1), abs(a2), abs(quad), abs(constant), 1e-300)

    def zero(v: float) -> bool:
        return abs(v) <= 1e-6 * big

    if zero(quad):
        if zero(a1) and zero(a2):
            return (Direction.NONE, 0.0) if abs(constant) < 1e-12 else (Direction.ZERO, constant)
        if zero(a2):
            return Direction.KL, a1
        if zero(a1):
            return Direction.REVERSE_KL, -a2
        if abs(a1 - a2) <= 1e-6 * big:
            return Direction.K3_REWARD, a1
    return Direction.OTHER, 0.0


def profile(term: ir.Node) -> GradientProfile:
    """The gradient profile of a loss term. Raises ``Unsupported``.
    A term that mixes the task's advantages with the KL inside a nonlinearity
    (OPMD's ``(A - tau * log_ratio) ** 2``) has no KL profile as a whole; its
    KL part is what remains with the advantages zero, as the maths measures it."""
    found = _profile(term, task=True)
    if found.direction is Direction.OTHER and _squares_advantage_with_kl(term):
        kl_part = _profile(term, task=False)
        if kl_part.direction not in (Direction.OTHER, Direction.NONE):
            return kl_part
    return found


def _squares_advantage_with_kl(term: ir.Node) -> bool:
    """A square of the advantages and the log-ratio together: a regression
    of one onto the other (OPMD), the only place they mix nonlinearly."""
    return any(
        (
            (isinstance(n, ir.Binary) and n.op == "pow" and _base_mixes(n.left))
            or (isinstance(n, ir.Unary) and n.op == "square" and _base_mixes(n.arg))
        )
        for n in term.walk()
    )


def _base_mixes(base: ir.Node) -> bool:
    return base.has_role(Role.ADVANTAGE) and base.has_role(Role.REFERENCE_LOGP)


def _profile(term: ir.Node, *, task: bool) -> GradientProfile:
    # One token.
    rows, target = [], []
    for p in _points(1, seed=1, task=task):
        c = gradient_coefficients(term, p)
        rows.append(_local_features(p.log_ratio[0]))
        target.append(c[0])
    if all(abs(y) < 1e-12 for y in target):
        return GradientProfile(Direction.NONE, 0.0, Credit.NONE, False, True)
    w, residual = _least_squares(rows, target)
    direction, scale = (
        (Direction.OTHER, 0.0) if residual > _TOL else _classify_local(w[1], w[2], w[3], w[0])
    )

    # Sequences: regress each token's coefficient on its own x, later x's and earlier x's.
    points = _points(HORIZON, seed=2, task=task)
    coefficients = [gradient_coefficients(term, p) for p in points]
    token_level = True
    credits: list[Credit] = []
    for t in range(HORIZON):
        feats = []
        for p in points:
            row = _local_features(p.log_ratio[t])
            for s in range(HORIZON):
                if s != t:
                    row += _local_features(p.log_ratio[s])[1:]
            feats.append(row)
        w, residual = _least_squares(feats, [c[t] for c in coefficients])
        if residual > _TOL:
            return GradientProfile(
                direction, scale, Credit.NOT_SEPARABLE, _is_sequence_k3(points, coefficients), False
            )
        token_credits, depends_on_others = _token_credits(t, w)
        credits += token_credits
        token_level = token_level and not depends_on_others
    if Credit.OTHER in credits or len(set(credits)) > 1:
        credit = Credit.OTHER
    else:
        credit = credits[0] if credits else Credit.NONE
    return GradientProfile(direction, scale, credit, False, token_level)


def _token_credits(t: int, w: list[float]) -> tuple[list[Credit], bool]:
    """How token t's fitted coefficient ``w`` credits it with later tokens'
    KL, and whether it depends on other tokens at all."""
    big = max(abs(v) for v in w) or 1.0
    credits: list[Credit] = []
    depends_on_others = False
    future: list[bool] = []  # per later token: credits t with its KL at the local scale
    others = [s for s in range(HORIZON) if s != t]
    for j, s in enumerate(others):
        a1, a2, quad = w[4 + 3 * j : 7 + 3 * j]
        if max(abs(a1), abs(a2), abs(quad)) > 1e-6 * big:
            depends_on_others = True
        if s < t:
            continue  # earlier tokens act as a baseline
        if max(abs(a1), abs(quad)) <= 1e-6 * big:
            future.append(False)  # exp(-x_s) alone has conditional mean 1: no credit
        elif abs(quad) <= 1e-6 * big and abs(a1 - w[1]) <= 1e-6 * big and w[1] != 0:
            future.append(True)
        else:
            credits.append(Credit.OTHER)
    if future:
        credits.append(
            Credit.REWARD_TO_GO if all(future) else Credit.NONE if not any(future) else Credit.OTHER
        )
    return credits, depends_on_others


def _is_sequence_k3(points: list[_Point], coefficients: list[list[float]]) -> bool:
    """``c_t = a * (1 - exp(-sum_s x_s))`` for every t: k3 of the sequence log-ratio."""
    rows = [[1.0 - math.exp(-sum(p.log_ratio))] for p in points]
    for t in range(HORIZON):
        _, residual = _least_squares(rows, [c[t] for c in coefficients])
        if residual > _TOL:
            return False
    return True


# ---------------------------------------------------------------- estimator names


def estimator_name(focus: ir.Node) -> str:
    """Name the KL estimate a subexpression computes, from its value per token:
    k1 = x, k2 = x**2 / 2, k3 = exp(-x) + x - 1 (x = logp - ref)."""
    rows, target = [], []
    try:
        for p in _points(1, seed=3):
            rows.append(_local_features(p.log_ratio[0]))
            target.append(value_of(focus, p))
    except Unsupported:
        return "KL estimate"
    w, residual = _least_squares(rows, target)
    if residual > _TOL:
        return "KL estimate"
    c, a1, a2, quad = w
    big = max(abs(v) for v in w) or 1.0

    def near(a: float, b: float) -> bool:
        return abs(a - b) <= 1e-6 * big

    if near(a2, 0) and near(quad, 0) and not near(a1, 0):
        return "k1 (log-ratio)" if a1 > 0 else "k1 (log-ratio, negated)"
    if near(a1, 0) and near(a2, 0) and not near(quad, 0):
        return "k2 (squared log-ratio)"
    if near(quad, 0) and near(a1, a2) and near(c, -a1) and not near(a1, 0):
        return "k3 (low_var_kl)"
    return "KL estimate"
