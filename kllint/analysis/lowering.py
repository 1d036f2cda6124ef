"""The torch vocabulary: how torch functions and tensor methods lower to the
KL IR. Registries map a spelling to its lowering (a new spelling is one
entry), and the lowerings that are not one IR operation live here too
(masking with ``torch.where``, ``F.mse_loss``, exact divergences over the
vocabulary).

Every lowering is a function over already-evaluated values: it gets a
``TorchCall`` (where the call is, how to spell it, and how to turn any value
into an IR node) and never evaluates code itself."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import libcst as cst

from kllint.analysis import ir, roles
from kllint.analysis.ir import Axis, Role
from kllint.analysis.module import dotted_name
from kllint.analysis.syntax import code, int_literal
from kllint.analysis.values import (
    HIDDEN,
    Choice,
    DictVal,
    Flipped,
    FuncRef,
    Grouped,
    NodeOf,
    Py,
    Seq,
    Unknown,
    Value,
    binary,
    choice,
    has_distribution,
    lift1,
    lift2,
    negate_condition,
    same_value,
)

TENSOR_IDENTITY = frozenset(
    {
        "float",
        "double",
        "half",
        "bfloat16",
        "to",
        # NumPy's cast of an array a tensor was copied into (``.numpy().astype(...)``).
        "astype",
        "contiguous",
        "view",
        "reshape",
        "squeeze",
        "unsqueeze",
        "flatten",
        "clone",
        "type",
        "type_as",
        "view_as",
        # A jagged nested tensor's rows, padded back to [B, T].
        "to_padded_tensor",
        "expand",
        "expand_as",
        "cuda",
        "cpu",
        "requires_grad_",
        "nan_to_num",
        "masked_fill",
        "bool",
        "long",
        "int",
        "gather",
        "take_along_dim",
        "index_select",
        "narrow",
        "select",
        "roll",
        "t",
        "transpose",
        "permute",
        "squeeze_",
        "unsqueeze_",
        "float_",
        "as_strided",
        "repeat",
        "repeat_interleave",
        "tile",
    }
)
UNARY = {
    "exp": "exp",
    "log": "log",
    "expm1": "expm1",
    "log1p": "log1p",
    "square": "square",
    "abs": "abs",
    "sqrt": "sqrt",
    "neg": "neg",
    "negative": "neg",
    "absolute": "abs",
}
BINARY_METHODS = {
    "mul": "mul",
    "multiply": "mul",
    "add": "add",
    "sub": "sub",
    "subtract": "sub",
    "div": "div",
    "divide": "div",
    "true_divide": "div",
    "pow": "pow",
}
MUTATING = frozenset(
    {
        "append",
        "extend",
        "insert",
        "add_",
        "mul_",
        "sub_",
        "div_",
        "copy_",
        "fill_",
        "masked_fill_",
        "clamp_",
        "zero_",
        "update",
    }
)
IN_PLACE = {
    "mul_": "mul",
    "add_": "add",
    "sub_": "sub",
    "div_": "div",
    "clamp_": "clamp",
    "clip_": "clamp",
    "masked_fill_": "masked_fill",
    "neg_": "neg",
    "exp_": "exp",
    "log_": "log",
    "pow_": "pow",
    "detach_": "detach",
    "index_add_": "index_add",
    "scatter_add_": "scatter_add",
    "index_put_": "index_put",
    "scatter_": "scatter",
}
# Reductions a tensor method makes (``x.sum()``, ``x.mean(dim=-1)``).
REDUCTIONS = frozenset({"sum", "mean", "nansum", "nanmean"})
# ``out.index_add_(0, seg_ids, x)``: ``x`` summed into slots (packed sequences).
SEGMENT_SUMS = frozenset({"index_add", "index_add_", "scatter_add", "scatter_add_"})
# ``out.index_put_((indices,), values)``, ``out.scatter_(dim, index, src)``:
# values written into the slots an index names (a packed batch padded back).
PUTS = frozenset({"index_put", "index_put_", "scatter", "scatter_"})
# Sizes are positive constants: a normaliser, not a gradient path.
SIZE_METHODS = frozenset({"size", "numel", "dim"})
# Methods kllint lowers on a value whose role is only known once resolved.
ON_RESOLVED = frozenset({"sum", "mean", "clamp", "exp"})
# ``scaler.scale(loss)`` (AMP): the scaled loss is the loss.
LOSS_SCALING = frozenset({"scale"})
# ``Categorical(logits=logits)``: a policy's next-token distributions, held
# as their log-probs over the vocabulary (``log_softmax(logits)``).
CATEGORICAL = frozenset({"Categorical"})
# Parameter annotations that say a value is a distribution object
# (``base: Categorical``, ``dist: torch.distributions.Distribution``).
DISTRIBUTION_TYPES = CATEGORICAL | frozenset(
    {"Distribution", "Independent", "OneHotCategorical", "TransformedDistribution"}
)
# ``dist.all_gather(chunks, local)``: a collective that writes copies into the
# buffers it is given, outside autograd.
GATHERS_INTO = frozenset({"all_gather"})
# ``dist.log_prob(actions)``: a log-prob of the distribution's policy.
DISTRIBUTION_LOGPROB = "log_prob"
DETACHING = frozenset({"detach", "item", "tolist", "numpy", "detach_"})
LOGPROB_OPS = frozenset({"log_softmax", "gather_log_probs", "logsumexp"})
AGGREGATORS = frozenset(
    {
        "masked_mean",
        "masked_sum",
        "agg_loss",
        "aggregate_loss",
        "masked_avg",
        "mean_with_mask",
        "sum_with_mask",
        "masked_average",
    }
)
# Where ``grad(loss_fn)(params, ...)`` comes from: the gradient of what
# ``loss_fn`` returns, as ``.backward()`` takes it.
FUNCTIONAL_MODULES = ("torch.func", "functorch")
# ``masked_whiten(advantages, mask, shift_mean=False)`` (TRL), ``whiten``,
# ``masked_normalization`` (AReaL): a batch whitening kllint cannot read.
WHITENERS = frozenset({"whiten", "masked_whiten", "masked_normalization"})


def whitened(values: ir.Node, mask: ir.Node | None, shift_mean: bool) -> ir.Node:
    """What the frameworks' whitening computes: ``(x - mean) * rsqrt(var +
    eps)`` over the batch (the mean added back when ``shift_mean`` is off),
    its statistics as the code that writes them out gives them. Whitened
    values are weights (advantages, rewards): the mean is detached, as under
    the ``no_grad`` the frameworks compute it in."""

    def batch_mean(x: ir.Node) -> ir.Node:
        if mask is None:
            return ir.Reduce("mean", Axis.ALL, x)
        masked = ir.Reduce("sum", Axis.ALL, ir.binary("mul", x, mask))
        return ir.binary("div", masked, ir.Reduce("sum", Axis.ALL, mask))

    mean = ir.detach(batch_mean(values))
    centred = ir.binary("sub", values, mean)
    # The batch's spread, a positive scale, kept whole as ``torch.rsqrt(var
    # + eps)`` written out is: over a large batch, a constant.
    scale = ir.Opaque("rsqrt(var + eps)")
    result = ir.binary("mul", centred, scale)
    return result if shift_mean else ir.binary("add", result, mean)


@dataclass
class TorchCall:
    """One call of a torch function or tensor method, its arguments evaluated."""

    origin: ir.Origin
    node: cst.CSTNode  # the call, for spelling
    as_node: NodeOf

    @property
    def code(self) -> str:
        return code(self.node)

    def lift1(self, value: Value, fn: Callable[[ir.Node], ir.Node]) -> Value:
        return lift1(value, fn, self.as_node)

    def lift2(self, left: Value, right: Value, fn: Callable[[ir.Node, ir.Node], ir.Node]) -> Value:
        return lift2(left, right, fn, self.as_node)

    def binary(self, op: str, left: Value, right: Value) -> Value:
        return binary(op, left, right, self.origin, self.as_node)


Args = list[Value]
Kwargs = dict[str, Value]
MethodLowering = Callable[[TorchCall, Value, Args, Kwargs], Value]
# A torch function's lowering; None: lower it as the tensor method of its first argument.
FunctionLowering = Callable[[TorchCall, Args, Kwargs], "Value | None"]

# ``with torch.no_grad():`` and ``@torch.inference_mode()``: nothing computed inside has a gradient.
NO_GRAD = frozenset({"no_grad", "inference_mode"})
# Modules without autograd: nothing computed there carries a gradient.
NON_AUTOGRAD_MODULES = frozenset({"numpy", "np", "math", "jax", "scipy"})
# ``torch.utils.checkpoint.checkpoint(fn, *inputs, ...)``'s own keywords,
# not passed to ``fn``.
CHECKPOINT_OPTIONS = frozenset(
    {"use_reentrant", "preserve_rng_state", "context_fn", "determinism_check", "debug"}
)
# Losses that are minus the sampled token's log-prob when not reduced.
NEGATED_LOG_PROBS = frozenset({"cross_entropy", "nll_loss"})
# Torch functions whose result is no KL estimate kllint models.
OPAQUE_FUNCTIONS = frozenset(
    {
        "cross_entropy",
        "nll_loss",
        "logsigmoid",
        "sigmoid",
        "softplus",
        "binary_cross_entropy_with_logits",
        "cat",
    }
)


def is_einops_view(module: str, name: str, pattern: object) -> bool:
    """``einops.rearrange(x, "(b g) t -> b g t")``: a pattern that regroups
    the other axes and puts time last (also from a time-major ``"t (b g)"``)
    gives ``x``'s values, with their gradient, as ``view`` does."""
    if module.split(".")[0] != "einops" or name != "rearrange" or not isinstance(pattern, str):
        return False
    source, arrow, target = pattern.partition("->")
    last_out = target.split()[-1:]
    return (
        bool(arrow)
        and bool(last_out)
        and last_out[0].isidentifier()
        and (last_out[0] in source.split())
    )


def einops_reduced(at: TorchCall, pattern: str, reduction: object, value: Value) -> Value | None:
    """``einops.reduce(x, "b g t -> b g", "sum")``: a sum or mean over the
    axes the pattern drops, the last of its input being time (as for
    ``x.sum(dim)``); None for another reduction or a pattern not of plain
    axes."""
    source, arrow, target = (side.split() for side in pattern.partition("->"))
    axes = source + target
    if not arrow or reduction not in ("sum", "mean") or not all(a.isidentifier() for a in axes):
        return None
    kind = str(reduction)
    if not set(target) <= set(source):
        return None
    dropped = [i for i, a in enumerate(source) if a not in target]
    if not dropped:
        return value
    time = len(source) - 1 in dropped
    if len(source) == 3:
        grouped = _view_as_groups(value)
        if isinstance(grouped, Grouped):
            if len(dropped) == 1:
                return _reduce_grouped_tokens(kind, grouped, Py(dropped[0]), at.origin)
            if time:
                return ir.Reduce(kind, Axis.TIME, grouped.node, origin=at.origin)
    reduced = Axis.BATCH if not time else Axis.TIME if len(dropped) < len(source) else Axis.ALL
    return at.lift1(value, lambda n: ir.Reduce(kind, reduced, n, origin=at.origin))


def einops_einsum(at: TorchCall, pattern: str, operands: Sequence[Value]) -> Value | None:
    """``einops.einsum(x, mask, "b t, b t -> b")``: ``torch.einsum`` with the
    pattern last and axes named by words, each given a letter."""
    letters: dict[str, str] = {}
    sides = []
    for side in pattern.replace(",", " , ").partition("->")[::2]:
        parts = []
        for axis in side.split():
            if axis == ",":
                parts.append(",")
            elif not axis.isidentifier() or len(letters) >= 26:
                return None  # ``...`` or a grouped ``(b g)``
            else:
                parts.append(letters.setdefault(axis, chr(ord("a") + len(letters))))
        sides.append("".join(parts))
    if "->" not in pattern:
        return None
    return _einsum(at, [Py(f"{sides[0]}->{sides[1]}"), *operands], {})


def einops_rearranged(pattern: str, value: Value) -> Value:
    """What a view by ``einops.rearrange`` (``is_einops_view``) gives: the
    values, grouped as ``[B, G, T]`` when the pattern makes three axes of
    them (``"(b g) t -> b g t"``), as ``view(-1, G, T)`` does."""
    axes = pattern.partition("->")[2].split()
    if len(axes) == 3 and all(a.isidentifier() for a in axes):
        return _view_as_groups(value)
    return value


def namespace(module: str, level: int) -> str | None:
    """``"torch"`` for torch and its submodules, ``"no-autograd"`` for NumPy &
    co., None for anything else (a module of the project)."""
    if level:
        return None
    root = module.split(".")[0]
    if root == "torch":
        return "torch"
    if root in NON_AUTOGRAD_MODULES or module.startswith("torch"):
        return "no-autograd"  # torchvision, torchaudio & co. are not modelled
    return None


# ----------------------------------------------------------------- tensor methods


def axis(dim: Value | None) -> Axis:
    """The axis a ``dim=`` argument reduces: 0 the batch, others time."""
    if dim is None or (isinstance(dim, Py) and dim.value is None):
        return Axis.ALL
    value: object = dim.value if isinstance(dim, (Py, ir.Const)) else None
    if isinstance(dim, Seq):
        # ``dim=(1,)``, ``dim=(-2, -1)``: time unless the batch axis is among them.
        axes = {axis(item) for item in dim.items}
        return axes.pop() if len(axes) == 1 else Axis.ALL
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return Axis.BATCH if int(value) == 0 else Axis.TIME
    return Axis.TIME


def _float(value: Value | None) -> float | None:
    if isinstance(value, ir.Const):
        return value.value
    if (
        isinstance(value, Py)
        and isinstance(value.value, (int, float))
        and not isinstance(value.value, bool)
    ):
        return float(value.value)
    return None


def gathered(at: TorchCall, receiver: Value, index: Value | None = None) -> Value:
    """``log_probs.gather(-1, ids)``: the log-prob of the sampled token. A
    gather at the indices of a top-k (``gather(-1, topk_ids)``) keeps k
    entries of each next-token distribution: a summed divergence over them is
    an exact one, not a sampled estimate."""
    if top_k_support(index):
        return receiver
    if isinstance(receiver, Unknown):
        return replace(receiver, distribution=False)
    return at.lift1(receiver, to_token_level)


def _identity(at: TorchCall, receiver: Value, args: Args, kwargs: Kwargs) -> Value:
    return receiver


# Splitting a tensor into rows or chunks: each piece is what the tensor is.
SPLITS = frozenset({"split", "chunk", "unbind", "tensor_split"})


def split_tensor(iterable: cst.BaseExpression) -> cst.BaseExpression | None:
    """The tensor ``x.split(lengths)`` or ``torch.split(x, lengths)`` cuts
    into pieces (``sum_of_sample_mean``'s per-sample rows)."""
    if not isinstance(iterable, cst.Call) or not isinstance(iterable.func, cst.Attribute):
        return None
    if iterable.func.attr.value not in SPLITS:
        return None
    receiver = iterable.func.value
    if isinstance(receiver, cst.Name) and receiver.value == "torch":
        return iterable.args[0].value if iterable.args else None
    return receiver


def splits_by_length(iterable: cst.BaseExpression) -> bool:
    """``x.split(response_lengths)``, ``torch.split(x, seqlens, dim=0)``: a packed
    tensor cut into its responses, not into chunks of rows (``x.split(4)``)."""
    assert isinstance(iterable, cst.Call)
    args = iterable.args[1:] if dotted_name(iterable.func) in ("torch.split",) else iterable.args
    if not args or args[0].keyword is not None:
        return False
    sizes = args[0].value
    name = (dotted_name(sizes) or "").rpartition(".")[2]
    dims = [a.value for a in args[1:] if a.keyword is None or a.keyword.value == "dim"]
    along_first = not dims or int_literal(dims[0]) == 0
    return along_first and any(
        w in ("lengths", "lens", "seqlens", "len") for w in roles.words(name)
    )


def _pieces(name: str) -> MethodLowering:
    """``per_token_loss.split(seq_lens)``, ``x.unbind(0)``: pieces along the
    first axis (samples, or a packed row's responses), each what the tensor
    is, as a loop over them binds each row. Cut along another axis (time
    columns, ``x.unbind(-1)``), a fold over the pieces sums over that axis:
    kllint does not follow it."""
    position = 0 if name == "unbind" else 1

    def lower(at: TorchCall, receiver: Value, args: Args, kwargs: Kwargs) -> Value:
        dim = kwargs.get("dim", args[position] if len(args) > position else None)
        if dim is not None and _float(dim) != 0:
            return ir.Opaque(f".{name}()")
        if isinstance(at.node, cst.Call) and splits_by_length(at.node):
            return Seq([receiver], appended=True, sequences=True)
        return receiver

    return lower


def _detach(at: TorchCall, receiver: Value, args: Args, kwargs: Kwargs) -> Value:
    origin = at.origin
    return at.lift1(receiver, lambda n: ir.detach(n, origin))


def _unary(op: str) -> MethodLowering:
    def lower(at: TorchCall, receiver: Value, args: Args, kwargs: Kwargs) -> Value:
        origin = at.origin
        return at.lift1(
            receiver,
            lambda n: ir.neg(n, origin) if op == "neg" else ir.Unary(op, n, origin=origin),
        )

    return lower


def _binary(op: str) -> MethodLowering:
    def lower(at: TorchCall, receiver: Value, args: Args, kwargs: Kwargs) -> Value:
        other = args[0] if args else kwargs.get("other", kwargs.get("exponent", Py(None)))
        return at.binary(op, receiver, other)

    return lower


def _clamp(name: str) -> MethodLowering:
    def lower(at: TorchCall, receiver: Value, args: Args, kwargs: Kwargs) -> Value:
        low = kwargs.get("min", args[0] if args else None)
        high = kwargs.get("max", args[1] if len(args) > 1 else None)
        if name == "clamp_max":
            low, high = None, low
        lo, hi = _float(low), _float(high)
        origin = at.origin
        return at.lift1(receiver, lambda n: ir.Clamp(n, lo, hi, origin=origin))

    return lower


def _relu(at: TorchCall, receiver: Value, args: Args, kwargs: Kwargs) -> Value:
    """``F.relu(kl - kl_budget)``: a hinge, ``clamp(min=0)``."""
    return _clamp("clamp")(at, receiver, [], {"min": ir.Const(0.0)})


def _reduce(name: str) -> MethodLowering:
    kind = "sum" if "sum" in name else "mean"

    def lower(at: TorchCall, receiver: Value, args: Args, kwargs: Kwargs) -> Value:
        dim = kwargs.get("dim", kwargs.get("axis", args[0] if args else None))
        reduced = axis(dim)
        origin = at.origin
        if isinstance(receiver, Choice) and any(
            isinstance(v, Grouped) for _, v in receiver.options
        ):
            # Rewards grouped by prompt on one path (a KL reward switched on)
            # and on the other: each path's groups reduced as groups.
            return Choice([(label, lower(at, v, args, kwargs)) for label, v in receiver.options])
        if isinstance(receiver, Grouped) and receiver.time:
            return _reduce_grouped_tokens(kind, receiver, dim, origin)
        if isinstance(receiver, Grouped):
            # A group baseline (``rewards.view(-1, n).mean(dim=1)``): over samples.
            return ir.Reduce(kind, Axis.BATCH, receiver.node, origin=origin)
        if reduced is Axis.TIME and has_distribution(receiver):
            return at.lift1(
                receiver, lambda n: vocabulary_expectation(kind, n, _written_at(n, origin))
            )
        if isinstance(receiver, Flipped):
            receiver = receiver.node if reduced is not Axis.BATCH else receiver
        return at.lift1(receiver, lambda n: ir.Reduce(kind, reduced, n, origin=origin))

    return lower


def _reduce_grouped_tokens(
    kind: str, grouped: Grouped, dim: Value | None, origin: ir.Origin
) -> Value:
    """A reduction of ``[B, G, T]`` token values: over time (the last axis)
    each sample's total, still grouped by prompt. Over the samples of a
    prompt (``dim=1``, the axis a flat ``[B*G, T]`` layout had for time) or
    over prompts, each token is added to the same token of independent
    samples, never to the later tokens of its own: for the expected
    gradient of k1, k2 or k3 of it, each sample's own token value (the
    others' terms have zero expected score, and ``E[exp(-x)] = 1``), up to
    a positive factor. Without gradient (a baseline over the group), it is
    a statistic of the batch, as a flat group's is."""
    index = _grouped_axis(dim)
    if index == 2:
        return Grouped(ir.Reduce(kind, Axis.TIME, grouped.node, origin=origin))
    if index is not None:
        if ir.depends_on_policy(grouped.node):
            return grouped.node
        return ir.Reduce(kind, Axis.BATCH, grouped.node, origin=origin)
    if dim is not None and not (isinstance(dim, Py) and dim.value is None):
        return ir.Reduce(kind, axis(dim), grouped.node, origin=origin)
    return ir.Reduce(kind, Axis.ALL, grouped.node, origin=origin)


def _grouped_axis(dim: Value | None) -> int | None:
    """Which axis of ``[B, G, T]`` a ``dim=`` names: 0 prompts, 1 samples,
    2 time (``dims=[1]`` as 1); None when it is not one literal axis."""
    if isinstance(dim, Seq) and len(dim.items) == 1:
        dim = dim.items[0]
    value = dim.value if isinstance(dim, (Py, ir.Const)) else None
    if (
        not isinstance(value, (int, float))
        or isinstance(value, bool)
        or int(value) not in range(-3, 3)
    ):
        return None
    return int(value) % 3


def _cumsum(at: TorchCall, receiver: Value, args: Args, kwargs: Kwargs) -> Value:
    origin = at.origin
    if isinstance(receiver, Grouped) and receiver.time:
        if _grouped_axis(args[0] if args else kwargs.get("dim")) in (0, 1):
            # A running sum over the samples of a prompt adds other samples'
            # values, independent of this one: the same token's value, plus
            # what does not move its gradient. Never a sum of later tokens.
            return receiver
    if isinstance(receiver, Choice) and any(isinstance(v, Flipped) for _, v in receiver.options):
        return Choice([(label, _cumsum(at, v, args, kwargs)) for label, v in receiver.options])
    if isinstance(receiver, Flipped):
        return Flipped(ir.CumSum(receiver.node, reverse=True, origin=origin))
    return at.lift1(receiver, lambda n: ir.CumSum(n, reverse=False, origin=origin))


def _flip(at: TorchCall, receiver: Value, args: Args, kwargs: Kwargs) -> Value:
    if isinstance(receiver, Grouped) and receiver.time:
        dims = args[0] if args else kwargs.get("dims")
        if _grouped_axis(dims) in (0, 1):
            return receiver  # the samples in another order
        receiver = receiver.node
    if isinstance(receiver, Choice):
        # ``rewards`` with a KL reward on one branch of a flag: each branch
        # reversed, so that flip-cumsum-flip is still a reward-to-go.
        return Choice([(label, _flip(at, v, args, kwargs)) for label, v in receiver.options])
    if isinstance(receiver, Flipped):
        return receiver.node
    if isinstance(receiver, ir.Node):
        return Flipped(receiver)
    return ir.Opaque("flip")


_LOGPROB_ROLES = (Role.POLICY_LOGP, Role.REFERENCE_LOGP, Role.OLD_LOGP)


def _segment_sum(at: TorchCall, receiver: Value, args: Args, kwargs: Kwargs) -> Value:
    """``out.index_add(dim, index, source)``, ``out.scatter_add(dim, index, src)``:
    ``out`` plus the elements of ``source`` summed into the slots ``index``
    names. Per-token log-probs summed into slots along the first axis are the
    tokens of packed sequences summed per sequence (``cu_seqlens``): a sum over
    time, so a sequence-level estimator built on it stays one. Anything else
    along that axis (scores summed per prompt group) is over samples."""
    source = args[2] if len(args) > 2 else kwargs.get("source", kwargs.get("src"))
    if source is None:
        return ir.Opaque(at.code)
    reduced = axis(args[0] if args else kwargs.get("dim"))
    if reduced is Axis.BATCH and _has_token_logprob(source):
        reduced = Axis.TIME
    origin = at.origin
    summed = at.lift1(source, lambda n: ir.Reduce("sum", reduced, n, origin=origin))
    if isinstance(receiver, ir.Opaque) and receiver.reason == ".zeros()":
        # ``torch.zeros(n).index_add_(0, seg_ids, x)``: the slots start empty.
        return summed
    return at.binary("add", receiver, summed)


def _put(position: int, keyword: str) -> MethodLowering:
    """``torch.zeros(B * T).index_put_((indices,), per_token)``: a new tensor
    of zeros holds the values written into it, each token's at its own
    position (the slots not written stay zero, as padding is). Written into
    a tensor that holds values of its own, the two mix: kllint cannot tell."""

    def lower(at: TorchCall, receiver: Value, args: Args, kwargs: Kwargs) -> Value:
        values = args[position] if len(args) > position else kwargs.get(keyword)
        if values is None or not (
            isinstance(receiver, ir.Node) and ir.is_new_constant_tensor(receiver)
        ):
            return ir.Opaque(at.code)
        return values

    return lower


def _segment_reduce(at: TorchCall, args: Args, kwargs: Kwargs) -> Value | None:
    """``torch.segment_reduce(x, "sum", lengths=lengths)`` over the flat axis of
    packed sequences: each sequence's tokens reduced, a reduction over time."""
    data = args[0] if args else kwargs.get("data")
    reduce = args[1] if len(args) > 1 else kwargs.get("reduce")
    if data is None or not (isinstance(reduce, Py) and reduce.value in ("sum", "mean")):
        return None
    kind = str(reduce.value)
    origin = at.origin
    return at.lift1(data, lambda n: ir.Reduce(kind, Axis.TIME, n, origin=origin))


def _pad(at: TorchCall, args: Args, kwargs: Kwargs) -> Value | None:
    """``F.pad(torch.cumsum(x, 0), (1, 0))``: a running sum with a zero in
    front, so that ``csum[cu_seqlens[1:]] - csum[cu_seqlens[:-1]]`` sums each
    packed sequence. The running sum is kept; any other padding stays opaque."""
    return args[0] if args and isinstance(args[0], ir.CumSum) else None


def _wrapped_function(args: Args) -> Value | None:
    """``torch.compile(loss_fn)``: the same function, compiled. (Not
    ``vmap(per_sample_loss)``: inside it a full ``.sum()`` is one sample's,
    which the IR cannot say.) A lambda that calls a loss helper stays opaque:
    the helper is judged where it is written, once."""
    wrapped = args[0] if args else None
    if isinstance(wrapped, FuncRef) and wrapped.name != "lambda":
        return wrapped
    return None


def _has_token_logprob(value: Value) -> bool:
    nodes = [v for _, v in value.options] if isinstance(value, Choice) else [value]
    return any(
        isinstance(n, ir.Node)
        and any(a.role in _LOGPROB_ROLES and a.level is ir.Level.TOKEN for a in n.atoms())
        for n in nodes
    )


def _opaque(name: str) -> MethodLowering:
    return lambda at, receiver, args, kwargs: ir.Opaque(name)


def _size(at: TorchCall, receiver: Value, args: Args, kwargs: Kwargs) -> Value:
    # Sizes are positive constants: a normaliser, not a gradient path.
    return ir.Atom(Role.COEFFICIENT, at.code)


def shifted_logits(op: str, left: Value, right: Value, node: cst.CSTNode) -> Unknown | None:
    """``logits - logits.max(-1, keepdim=True).values``: the same logits for a
    softmax, which no shift of a position's logits changes (the max is taken
    for numerical safety before the exps of a log-softmax written by hand)."""
    if not (
        op == "sub"
        and isinstance(left, Unknown)
        and isinstance(right, Unknown)
        and not left.logprob_op
        and any(roles.names_logits(n) for n in left.names)
        and ("max" in right.names or "amax" in right.names)
        and set(left.names) <= set(right.names)
    ):
        return None
    return replace(left, text=code(node))


def max_added_back(op: str, left: Value, right: Value) -> Unknown | None:
    """``row_max + torch.log(torch.exp(z - row_max).sum(-1, keepdim=True))``:
    the logits' log Z, stabilised by their max and the max added back, is
    their logsumexp."""
    if op != "add" or not isinstance(left, Unknown) or not isinstance(right, Unknown):
        return None
    for top, log_z in ((left, right), (right, left)):
        if (
            ("max" in top.names or "amax" in top.names)
            and any(roles.names_logits(n) for n in top.names)
            and log_z.logprob_op
            and log_z.names[:1] == ("logsumexp",)
            and {n for n in top.names if roles.names_logits(n)} <= set(log_z.names)
        ):
            return log_z
    return None


def normaliser_by_hand(op: str, value: Unknown, node: cst.CSTNode) -> Unknown | None:
    """``z.exp().sum(-1, keepdim=True).log()`` of logits ``z``: their log Z
    written out (a vocab-parallel log-softmax sums each shard's exps across
    ranks before the log), so that ``z - log_z`` is the log-softmax as
    ``z - torch.logsumexp(z, -1)`` is. Each step keeps the logits' names."""
    if op not in ("exp", "sum", "log"):
        return None
    head, rest = (value.names[0], value.names[1:]) if value.names else ("", ())
    if op == "exp" and not value.logprob_op and any(roles.names_logits(n) for n in value.names):
        return replace(value, text=code(node), names=("exp of logits", *value.names), call=True)
    if op == "sum" and head == "exp of logits":
        return replace(value, text=code(node), names=("sum of exp of logits", *rest))
    if op == "log" and head == "sum of exp of logits":
        return replace(value, text=code(node), names=("logsumexp", *rest), logprob_op=True)
    return None


def normalised_gather(op: str, left: Value, right: Value, picked: bool = True) -> Value | None:
    """``x.gather(-1, ids).squeeze(-1) - torch.logsumexp(x, -1)``: the sampled
    token's log-softmax without the full log-softmax (a fused kernel's idiom),
    a log-prob whose role its name or its model says. ``x - lse[..., None]``
    with ``lse`` the logsumexp of ``x`` (computed apart, in chunks): the
    log-softmax over the whole vocabulary (``picked``: whether the left side
    picks the sampled tokens, as the syntax shows)."""
    if not (
        op == "sub"
        and isinstance(left, Unknown)
        and isinstance(right, Unknown)
        and right.logprob_op
        and "logsumexp" in right.names
        and set(left.names) & set(right.names[1:])
    ):
        return None
    whole = not picked and not left.logprob_op and set(left.names) <= set(right.names[1:])
    return replace(
        left,
        text=f"{left.text} - {right.text}",
        call=True,
        logprob_op=True,
        distribution=whole,
        reference_model=left.reference_model or right.reference_model,
    )


def _view(at: TorchCall, receiver: Value, args: Args, kwargs: Kwargs) -> Value:
    """``x.view(-1, n)`` regroups samples; ``x.view(-1)``, ``flatten()`` undo it."""
    if isinstance(receiver, Choice):
        return Choice([(label, _view(at, v, args, kwargs)) for label, v in receiver.options])
    if isinstance(receiver, Grouped):
        # ``view(-1)`` and ``view(-1, 1)`` (one score per sample, as a column)
        # undo the groups; so does ``view(-1, T)`` of ``[B, G, T]``.
        ungrouped = len(args) <= 1 or (len(args) == 2 and (receiver.time or _float(args[1]) == 1))
        return receiver.node if ungrouped else receiver
    if len(args) == 3 and _float(args[2]) != 1:  # ``view(B, T, 1)``: a column, not groups
        return _view_as_groups(receiver)
    if (
        len(args) == 2
        and _float(args[0]) == -1
        and _float(args[1]) != 1  # ``view(-1, 1)``: a column to broadcast, not groups
        and isinstance(receiver, ir.Node)
        and not isinstance(receiver, ir.Opaque)
    ):
        return Grouped(receiver)
    return receiver


def _view_as_groups(value: Value) -> Value:
    """``logp.view(-1, G, T)``: token values grouped by prompt, time last."""
    if isinstance(value, Choice):
        return Choice([(label, _view_as_groups(v)) for label, v in value.options])
    if (
        isinstance(value, ir.Node)
        and not isinstance(value, ir.Opaque)
        and not has_distribution(value)
    ):
        return Grouped(value, time=True)
    return value


def _gather(at: TorchCall, receiver: Value, args: Args, kwargs: Kwargs) -> Value:
    return gathered(at, receiver, args[1] if len(args) > 1 else kwargs.get("index"))


def _log_prob(at: TorchCall, receiver: Value, args: Args, kwargs: Kwargs) -> Value:
    """``Categorical(logits=logits).log_prob(ids)``: the sampled token's
    log-prob under that distribution, as a gather of its log-softmax."""
    if has_distribution(receiver):
        return gathered(at, receiver, args[0] if args else kwargs.get("value"))
    return ir.Opaque(".log_prob()")


def _entropy(at: TorchCall, receiver: Value, args: Args, kwargs: Kwargs) -> Value:
    """``Categorical(logits=...).entropy()``: ``-sum_v p_v log p_v`` at each position."""
    if not has_distribution(receiver):
        return ir.Opaque(".entropy()")
    origin = at.origin
    return at.lift1(
        receiver,
        lambda n: vocabulary_expectation(
            "sum", ir.neg(ir.Binary("mul", ir.Unary("exp", n), n)), origin
        ),
    )


def _take_along_dim(at: TorchCall, receiver: Value, args: Args, kwargs: Kwargs) -> Value:
    """``torch.take_along_dim(logp, ids.unsqueeze(-1), dim=-1)``: a gather."""
    return gathered(at, receiver, args[0] if args else kwargs.get("indices"))


def top_k_support(index: Value | None) -> bool:
    """Indices from ``torch.topk`` (``topk_ids``, ``top_k_indices``)."""
    if not isinstance(index, Unknown):
        return False
    return any("topk" in n.lower().replace("_", "") for n in index.names)


# ``torch.triu(torch.ones(T, T))``: a [T, T] matrix of ones on and above the
# diagonal. ``x @ triu`` sums each token's earlier log-ratios (a prefix sum),
# ``x @ tril`` its later ones (the reward-to-go): True for a reverse sum.
_TRIANGULAR_ONES = {".triu(ones)": False, ".tril(ones)": True}
_ONES = ".ones()"  # ``torch.ones(T)``, a new tensor of ones
TRIANGLES = frozenset({"triu", "tril"})


def triangular_ones(node: Value) -> bool | None:
    """Whether ``x @ node`` is a reverse (True) or forward (False) cumulative
    sum over time; None for anything else."""
    if isinstance(node, ir.Opaque):
        return _TRIANGULAR_ONES.get(node.reason)
    return None


def is_marker(node: Value) -> bool:
    """An opaque tensor kllint follows by what it is, which a dtype or device
    move keeps: a triangular matrix of ones, a one-hot token picker."""
    return triangular_ones(node) is not None or (
        isinstance(node, ir.Opaque) and node.reason == ONE_HOT
    )


def _triangle_method(name: str) -> MethodLowering:
    def lower(at: TorchCall, receiver: Value, args: Args, kwargs: Kwargs) -> Value:
        lowered = _triangle(name)(at, [receiver, *args], kwargs)
        return lowered if lowered is not None else ir.Opaque(f".{name}()")

    return lower


def _triangle(name: str) -> FunctionLowering:
    def lower(at: TorchCall, args: Args, kwargs: Kwargs) -> Value | None:
        offset = args[1] if len(args) > 1 else kwargs.get("diagonal")
        if (
            args
            and isinstance(args[0], ir.Opaque)
            and args[0].reason == _ONES
            and (offset is None or (isinstance(offset, ir.Const) and offset.value == 0))
        ):
            return ir.Opaque(f".{name}(ones)")
        return None

    return lower


def matmul(at: TorchCall, x: Value, matrix: Value) -> Value | None:
    """``log_ratio @ torch.tril(torch.ones(T, T))``: a cumulative sum over time."""
    reverse = triangular_ones(matrix)
    if reverse is None or not isinstance(x, ir.Node) or isinstance(x, ir.Opaque):
        return None
    return ir.CumSum(x, reverse=reverse, origin=at.origin)


def weighted_sum(at: TorchCall, terms: Value, weights: Value) -> Value | None:
    """``torch.stack([pg_loss, kl_loss, entropy]) @ coefs`` with ``coefs`` a
    tensor of as many numbers: each term times its weight, summed."""
    if not (isinstance(terms, Seq) and isinstance(weights, Seq)) or terms.appended:
        return None
    if not terms.items or len(terms.items) != len(weights.items):
        return None
    products = [at.binary("mul", term, weight) for term, weight in zip(terms.items, weights.items)]
    total = products[0]
    for product in products[1:]:
        total = at.binary("add", total, product)
    return total


def masked_dot(at: TorchCall, x: Value, mask: Value, flattened: bool) -> Value | None:
    """``kl @ mask_vec``: the sum of ``x * mask`` over the axis the product
    contracts, time for ``[B, T] @ [T]``, everything for two flattened
    ``[B*T]`` vectors (``kl.reshape(-1) @ mask.reshape(-1)``)."""
    if not (isinstance(mask, ir.Node) and is_mask(mask)) or not isinstance(x, (ir.Node, Choice)):
        return None
    reduced = Axis.ALL if flattened else Axis.TIME
    product = at.binary("mul", x, mask)
    return at.lift1(product, lambda n: ir.Reduce("sum", reduced, n, origin=at.origin))


def _matmul(at: TorchCall, receiver: Value, args: Args, kwargs: Kwargs) -> Value:
    """``x.matmul(m)`` and ``torch.matmul(x, m)`` (the tensor method of ``x``)."""
    summed = matmul(at, receiver, args[0]) if len(args) == 1 else None
    return summed if summed is not None else ir.Opaque(".matmul()")


def _new_tensor(at: TorchCall, receiver: Value, args: Args, kwargs: Kwargs) -> Value:
    copied = _tensor(at, args, kwargs)
    return copied if copied is not None else Unknown(at.code, ("tensor",), call=True, detached=True)


def _method_registry() -> dict[str, MethodLowering]:
    """Earlier entries win: ``gather`` keeps the token it selects although it
    also keeps the tensor's role, ``item`` detaches."""
    registry: dict[str, MethodLowering] = {"gather": _gather, "take_along_dim": _take_along_dim}
    for name in ("view", "reshape", "flatten", "unflatten"):
        registry[name] = _view
    for name in TENSOR_IDENTITY:
        registry.setdefault(name, _identity)
    for name in SPLITS:
        registry.setdefault(name, _pieces(name))
    for name in DETACHING:
        registry.setdefault(name, _detach)
    for name, op in UNARY.items():
        registry.setdefault(name, _unary(op))
    for name, op in BINARY_METHODS.items():
        registry.setdefault(name, _binary(op))
    for name in ("clamp", "clip", "clamp_min", "clamp_max", "clip_"):
        registry.setdefault(name, _clamp(name))
    for name in ("relu", "relu_"):
        registry.setdefault(name, _relu)
    for name in REDUCTIONS:
        registry.setdefault(name, _reduce(name))
    registry.setdefault("cumsum", _cumsum)
    registry.setdefault("matmul", _matmul)
    for name in SEGMENT_SUMS:
        registry.setdefault(name, _segment_sum)
    for name in ("index_put", "index_put_"):
        registry.setdefault(name, _put(1, "values"))
    for name in ("scatter", "scatter_"):
        registry.setdefault(name, _put(2, "src"))
    # A new tensor of zeros (or ones) shaped like the receiver: a constant.
    registry.setdefault("new_zeros", lambda at, receiver, args, kwargs: ir.Const(0.0))
    registry.setdefault("new_ones", lambda at, receiver, args, kwargs: ir.Const(1.0))
    # ``x.masked_select(loss_mask)``: the kept tokens packed flat; summed, as
    # the tokens weighted by the 0/1 mask.
    registry.setdefault("masked_select", _binary("mul"))
    # ``x.new_tensor(data)``: ``data`` copied into a new tensor, without its graph.
    registry.setdefault("new_tensor", _new_tensor)
    registry.setdefault("log_prob", _log_prob)
    registry.setdefault("entropy", _entropy)
    registry.setdefault("flip", _flip)
    registry.setdefault("fliplr", _flip)
    for name in ("log_softmax", "softmax"):
        registry.setdefault(name, _opaque(name))
    for name in SIZE_METHODS:
        registry.setdefault(name, _size)
    registry.setdefault("item", _detach)
    for name in TRIANGLES:
        # ``torch.ones(T, T).tril()``, as ``torch.tril(torch.ones(T, T))``.
        registry.setdefault(name, _triangle_method(name))
    return registry


TENSOR_METHODS: dict[str, MethodLowering] = _method_registry()


def tensor_method(at: TorchCall, name: str, receiver: Value, args: Args, kwargs: Kwargs) -> Value:
    """``receiver.name(*args, **kwargs)`` on a tensor."""
    lowering = TENSOR_METHODS.get(name)
    if lowering is None:
        return ir.Opaque(f".{name}()")
    return lowering(at, receiver, args, kwargs)


# ----------------------------------------------------------------- tensor attributes


def _data(at: TorchCall, base: Value) -> Value:
    origin = at.origin
    return at.lift1(base, lambda n: ir.detach(n, origin))


def _shape(at: TorchCall, base: Value) -> Value:
    # Sizes are positive constants: a normaliser, not a gradient path.
    return ir.Atom(Role.COEFFICIENT, at.code)


def _distribution_probs(at: TorchCall, base: Value) -> Value | None:
    """``Categorical(logits=...).probs``: the probabilities of its log-probs."""
    return at.lift1(base, lambda n: ir.Unary("exp", n)) if has_distribution(base) else None


def _distribution_logits(at: TorchCall, base: Value) -> Value | None:
    """``Categorical(logits=...).logits``: its log-probs (torch normalises them)."""
    return base if has_distribution(base) else None


TENSOR_ATTRIBUTES: dict[str, Callable[[TorchCall, Value], Value | None]] = {
    "probs": _distribution_probs,
    "logits": _distribution_logits,
    "data": _data,  # the tensor without its graph
    "T": lambda at, base: base,
    "mT": lambda at, base: base,
    "real": lambda at, base: base,
    "shape": _shape,
}


def tensor_attribute(at: TorchCall, name: str, base: Value) -> Value | None:
    """``tensor.name``; None for an attribute that is no tensor operation."""
    lowering = TENSOR_ATTRIBUTES.get(name)
    return lowering(at, base) if lowering is not None else None


def grad_switch(context: cst.BaseExpression) -> str | None:
    """What a context does to autograd: ``"off"`` (``torch.no_grad()``,
    ``torch.set_grad_enabled(False)``), ``"inference"``
    (``torch.inference_mode()``, which ``enable_grad`` inside cannot undo),
    ``"on"`` (``torch.enable_grad()``, ``set_grad_enabled(True)``), None for
    anything else (``set_grad_enabled(is_train)``: as it was)."""
    if not isinstance(context, cst.Call):
        return None
    last = (dotted_name(context.func) or "").rpartition(".")[2]
    if last == "inference_mode":
        return "inference"
    if last in NO_GRAD:
        return "off"
    if last == "enable_grad":
        return "on"
    if last == "set_grad_enabled" and context.args:
        flag = context.args[0].value
        if isinstance(flag, cst.Name) and flag.value in ("True", "False"):
            return "on" if flag.value == "True" else "off"
    return None


def decorated_no_grad(fn: cst.FunctionDef) -> bool:
    """``@torch.no_grad()`` or ``@torch.inference_mode()`` on a function."""
    for decorator in fn.decorators:
        expr = decorator.decorator
        name = dotted_name(expr.func) if isinstance(expr, cst.Call) else dotted_name(expr)
        if name is not None and name.split(".")[-1] in NO_GRAD:
            return True
    return False


# ``class FusedKL(torch.autograd.Function)``: a hand-written gradient. Its
# ``forward(ctx, ...)`` gives the value, its ``backward(ctx, grad_output)`` the
# gradient of each input; what ``ctx`` keeps between the two is read back.
AUTOGRAD_FUNCTION_CALL = "apply"
SAVE_FOR_BACKWARD = "save_for_backward"
SAVED_TENSORS = ("saved_tensors", "saved_variables")


def is_autograd_function(bases: Sequence[str]) -> bool:
    """A class deriving from ``torch.autograd.Function`` (however imported)."""
    return any(base.rpartition(".")[2] == "Function" for base in bases)


# ----------------------------------------------------------------- torch functions


def _extremum(name: str) -> FunctionLowering:
    op = "max" if name in ("max", "maximum") else "min"

    def lower(at: TorchCall, args: Args, kwargs: Kwargs) -> Value | None:
        if len(args) == 2 and not kwargs:
            second = args[1]
            if isinstance(second, (ir.Node, Choice)) and not (
                isinstance(second, ir.Const)
                and float(second.value).is_integer()
                and name in ("max", "min")
            ):
                return at.binary(op, args[0], second)
        return ir.Opaque(f"torch.{name}")  # a reduction with indices, or unknown

    return lower


def _where(at: TorchCall, args: Args, kwargs: Kwargs) -> Value | None:
    """torch.where(mask.bool(), values, 0.0): masking, values * mask.
    Any other condition (a clip, a comparison) stays opaque."""
    if len(args) != 3:
        return None
    condition, chosen, other = args
    if not (isinstance(condition, ir.Node) and is_mask(condition)):
        # Any other condition (``denom > 0``, ``ratio > cap``) guards or clips:
        # where only one side has a gradient path to the policy, that side is
        # what flows (an empty-mask guard's 0, a truncation's constant cap).
        if _flows(chosen) and not _flows(other):
            return chosen
        if _flows(other) and not _flows(chosen):
            return other
        if _is_zero(other) and _compares_two_policies(chosen):
            # ``torch.where(m.bool(), lp.detach() - lq, torch.zeros_like(lq))``,
            # ``torch.where(loss_mask.bool(), kld * loss_mask, 0.0)``: a KL
            # estimate zeroed where a mask kllint cannot name is off. (One
            # policy's probability so guarded, ``p_teacher`` over a top-k
            # support, stays opaque: which tokens it covers is not known.)
            return chosen
        sides = _flows(chosen) or (_a_setting(at, chosen) and _a_setting(at, other))
        if sides and isinstance(at.node, cst.Call) and at.node.args:
            # ``torch.where(advantages < 0, dual_clipped, clipped)``: each
            # element is one side or the other, each side a loss of its own;
            # both are judged, as two hidden paths. So are two coefficients
            # (``torch.where(is_on_policy, -beta, sft_coef)``), paired with the
            # terms a ``where`` on the same condition picks.
            test = HIDDEN + code(at.node.args[0].value)
            return choice([(test, chosen), (negate_condition(test), other)])
        return ir.Opaque("torch.where")
    origin = at.origin

    def masked(a: ir.Node, b: ir.Node) -> ir.Node:
        kept = ir.binary("mul", a, condition, origin)
        if isinstance(b, ir.Const) and b.value == 0:
            return kept
        rest = ir.binary("mul", b, ir.binary("sub", ir.Const(1.0), condition, origin), origin)
        return ir.binary("add", kept, rest, origin)

    return at.lift2(chosen, other, masked)


def _a_setting(at: TorchCall, value: Value) -> bool:
    """A coefficient or a literal, signed or scaled: no tensor of the run."""
    if isinstance(value, Unknown):
        value = at.as_node(value)
    return isinstance(value, ir.Node) and ir.settings_only(value)


def _full_like(at: TorchCall, args: Args, kwargs: Kwargs) -> Value | None:
    """``torch.full_like(nll, -beta)``: the value everywhere."""
    return args[1] if len(args) > 1 else kwargs.get("fill_value")


def _bmm(at: TorchCall, args: Args, kwargs: Kwargs) -> Value | None:
    """``torch.bmm(x.unsqueeze(1), mask.unsqueeze(2))``: each row's ``[1, T] @
    [T, 1]`` product, the masked sum over time of ``x``; ``torch.bmm(x, tril)``
    a cumulative sum, as ``x @ tril``."""
    call = at.node
    if len(args) != 2 or not isinstance(call, cst.Call) or len(call.args) != 2:
        return None
    summed = matmul(at, args[0], args[1])
    if summed is not None:
        return summed
    axes = [method_axis(a.value, "unsqueeze") for a in call.args]
    if axes[0] != 1 or axes[1] not in (2, -1):
        return None
    product = at.binary("mul", args[0], args[1])
    return at.lift1(product, lambda n: ir.Reduce("sum", Axis.TIME, n, origin=at.origin))


def _tensordot(at: TorchCall, args: Args, kwargs: Kwargs) -> Value | None:
    """``torch.tensordot(kl * mask, torch.ones(T), dims=([1], [0]))``: a
    ``[B, T]`` tensor contracted over its time axis with a vector of ones
    (or a mask): its (masked) sum over time."""
    call = at.node
    if len(args) != 2 or not isinstance(call, cst.Call):
        return None
    given = [a.value for a in call.args if a.keyword is None]
    dims = given[2] if len(given) > 2 else None
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "dims":
            dims = arg.value
    if _contracted_axis(dims) not in (1, -1):
        return None
    tensor, vector = args
    if isinstance(vector, ir.Opaque) and vector.reason == _ONES:
        weighted: Value = tensor
    elif isinstance(vector, ir.Node) and is_mask(vector):
        weighted = at.binary("mul", tensor, vector)
    else:
        return None
    if not isinstance(weighted, (ir.Node, Choice)) or isinstance(weighted, ir.Opaque):
        return None
    return at.lift1(weighted, lambda n: ir.Reduce("sum", Axis.TIME, n, origin=at.origin))


def _contracted_axis(dims: cst.BaseExpression | None) -> int | None:
    """The one axis of the first tensor that ``dims`` contracts: ``([1], [0])``,
    or ``1`` (its last axis, -1)."""
    if dims is None:
        return None
    if isinstance(dims, (cst.Tuple, cst.List)) and len(dims.elements) == 2:
        first = dims.elements[0].value
        if isinstance(first, (cst.Tuple, cst.List)) and len(first.elements) == 1:
            return int_literal(first.elements[0].value)
        return int_literal(first)
    return -1 if int_literal(dims) == 1 else None


def method_axis(expr: cst.BaseExpression, method: str) -> int | None:
    """The axis of ``x.method(axis)`` written with a number
    (``x.unsqueeze(1)``, ``x.unbind(-1)``); None for anything else."""
    if not (
        isinstance(expr, cst.Call)
        and isinstance(expr.func, cst.Attribute)
        and expr.func.attr.value == method
        and len(expr.args) == 1
    ):
        return None
    return int_literal(expr.args[0].value)


def _xlogy(at: TorchCall, args: Args, kwargs: Kwargs) -> Value | None:
    """``torch.xlogy(p, q)``: ``p * log(q)`` (0 where ``p`` is 0)."""
    if len(args) != 2:
        return None
    origin = at.origin
    return at.lift2(
        args[0], args[1], lambda x, y: ir.binary("mul", x, log_of_probability(y, origin), origin)
    )


def log_of_probability(y: ir.Node, origin: ir.Origin | None = None) -> ir.Node:
    """``log(q)`` with ``q = ref_logprobs.exp()`` (``xlogy(p, q)``,
    ``Categorical(probs=q)``): the log-prob itself, detached if ``q`` was."""
    inner, detached = y, False
    while isinstance(inner, ir.Unary) and inner.op == "detach":
        inner, detached = inner.arg, True
    if isinstance(inner, ir.Unary) and inner.op == "exp":
        return ir.detach(inner.arg, origin) if detached else inner.arg
    return ir.Unary("log", y, origin=origin)


def _compares_two_policies(value: Value) -> bool:
    """One policy's log-probs against another's: a KL estimate (also of the
    rollout's stored log-probs against the reference's, without gradient)."""
    if isinstance(value, Choice):
        return all(_compares_two_policies(option) for _, option in value.options)
    if not isinstance(value, ir.Node):
        return False
    roles = {a.role for a in value.atoms()}
    return len(roles & set(_LOGPROB_ROLES)) >= 2


def _is_zero(value: Value) -> bool:
    return isinstance(value, ir.Const) and value.value == 0


def _flows(value: Value) -> bool:
    if isinstance(value, Choice):
        return any(_flows(v) for _, v in value.options)
    return isinstance(value, ir.Node) and ir.depends_on_policy(value)


def _mse_loss(at: TorchCall, args: Args, kwargs: Kwargs) -> Value | None:
    """F.mse_loss(logp, ref) = mean((logp - ref) ** 2): twice k2."""
    if len(args) < 2:
        return None
    reduction = kwargs.get("reduction", Py("mean"))
    origin = at.origin
    squared = at.lift2(
        args[0],
        args[1],
        lambda a, b: ir.Unary("square", ir.binary("sub", a, b, origin), origin=origin),
    )
    if isinstance(reduction, Py) and reduction.value in ("mean", "sum"):
        kind = str(reduction.value)
        return at.lift1(squared, lambda n: ir.Reduce(kind, Axis.ALL, n, origin=origin))
    return squared


def _kl_div(at: TorchCall, args: Args, kwargs: Kwargs) -> Value | None:
    """F.kl_div(input, target): ``exp(target) * (target - input)`` elementwise
    with ``log_target=True``, ``target * (log(target) - input)`` without.
    Over next-token distributions that is the integrand of an exact divergence
    at each position, judged as such once summed over the vocabulary
    (``vocabulary_expectation``). On gathered log-probs it is no estimator
    kllint models: no claim."""
    inputs = [*args[:2], *(kwargs.get(k) for k in ("input", "target")[len(args[:2]) :])]
    if len(inputs) != 2 or any(v is None for v in inputs):
        return ir.Opaque("torch.kl_div")
    source, target = inputs
    log_target = kwargs.get("log_target", Py(False))
    if not isinstance(log_target, Py) or not isinstance(log_target.value, bool):
        return ir.Opaque("torch.kl_div")
    origin = at.origin

    def integrand(q: ir.Node, p: ir.Node) -> ir.Node:
        if log_target.value:
            log_p, weight = p, ir.Unary("exp", p, origin=origin)
        elif isinstance(p, ir.Unary) and p.op == "exp":
            log_p, weight = p.arg, p  # probabilities written as exp(log-probs)
        else:
            return ir.Opaque("torch.kl_div of probabilities")
        return ir.binary("mul", weight, ir.binary("sub", log_p, q, origin), origin)

    assert source is not None and target is not None
    pointwise = at.lift2(source, target, integrand)
    if not has_distribution(pointwise):
        return ir.Opaque("torch.kl_div over sampled tokens")
    reduction = kwargs.get("reduction", Py("mean"))
    if isinstance(reduction, Py) and reduction.value == "none":
        return pointwise  # the caller's ``.sum(-1)`` sums over the vocabulary
    if not (isinstance(reduction, Py) and reduction.value in ("sum", "batchmean", "mean")):
        return ir.Opaque("torch.kl_div")
    # Every element at once: the vocabulary first, then positions and samples
    # (``batchmean`` and ``mean`` divide by a size, a positive constant).
    kind = "sum" if reduction.value == "sum" else "mean"
    return at.lift1(
        pointwise,
        lambda n: ir.Reduce(
            kind, Axis.ALL, vocabulary_expectation("sum", n, origin), origin=origin
        ),
    )


def _kl_divergence(at: TorchCall, args: Args, kwargs: Kwargs) -> Value | None:
    """``torch.distributions.kl_divergence(p, q)`` between the per-position
    Categoricals of two policies' logits: ``sum_v p_v (log p_v - log q_v)``
    at each position, an exact divergence (``vocabulary_expectation``). Any
    other pair of distributions is no estimator kllint models."""
    if len(args) != 2:
        return ir.Opaque("torch.kl_divergence")
    origin = at.origin
    pointwise = at.lift2(
        args[0],
        args[1],
        lambda p, q: ir.binary(
            "mul", ir.Unary("exp", p, origin=origin), ir.binary("sub", p, q, origin), origin
        ),
    )
    if not has_distribution(pointwise):
        return ir.Opaque("torch.kl_divergence")
    return at.lift1(pointwise, lambda n: vocabulary_expectation("sum", n, origin))


def _stack(at: TorchCall, args: Args, kwargs: Kwargs) -> Value | None:
    if (
        args
        and isinstance(args[0], Choice)
        and all(isinstance(option, Seq) for _, option in args[0].options)
    ):
        # A list some path appended to (``if use_kl_loss: kl_terms.append(...)``
        # in a loop): each path's rows; a list no path filled cannot be
        # stacked, so that path does not reach here.
        stacked = [
            (label, _stack(at, [option, *args[1:]], kwargs))
            for label, option in args[0].options
            if isinstance(option, Seq) and option.items
        ]
        kept = [(label, value) for label, value in stacked if value is not None]
        return Choice(kept) if len(kept) > 1 else (kept[0][1] if kept else None)
    if not args or not isinstance(args[0], Seq):
        return None
    rows = args[0].items
    if args[0].appended:
        # Rows or steps collected in a loop, put back together.
        if rows and all(same_value(row, rows[0]) or row is rows[0] for row in rows):
            return rows[0]
    elif rows and all(isinstance(i, (ir.Node, Choice)) for i in rows):
        return args[0]
    return Unknown(at.code, ("stack",), call=True)


def _pad_sequence(at: TorchCall, args: Args, kwargs: Kwargs) -> Value | None:
    """Rows padded into one tensor; the pieces of a packed tensor cut by
    length (``torch.split(token_rewards, lengths)``) padded back are what
    the tensor is, each token at its own response's row."""
    if args and isinstance(args[0], (ir.Node, Choice)) and not isinstance(args[0], ir.Opaque):
        return args[0]
    return _stack(at, args, kwargs)


def _constant(value: float) -> FunctionLowering:
    return lambda at, args, kwargs: ir.Const(value, origin=at.origin)


# ``torch.tensor(floats)``, ``torch.from_numpy(array)``: tensors made from data, with no
# graph (``torch.as_tensor`` of a tensor is that tensor: see ``_as_tensor``).
NEW_TENSORS = frozenset({"tensor", "as_tensor", "scalar_tensor", "from_numpy"})


def _tensor(at: TorchCall, args: Args, kwargs: Kwargs) -> Value | None:
    """``torch.tensor(data)``: a new tensor without a graph (a rollout
    engine's log-probs as floats, a copy of a tensor)."""
    if args and isinstance(args[0], ir.Const):
        return args[0]
    data = args[0] if args else None
    if isinstance(data, Seq) and len(data.items) == 1 and data.appended:
        # ``torch.tensor([0.5 * seg.sum() ** 2 for seg in ...])``: one row
        # stands for each, copied out of the graph.
        data = data.items[0]
    if isinstance(data, ir.Node):
        return ir.detach(data, at.origin)
    if (
        isinstance(data, Seq)
        and not data.appended
        and any(isinstance(item, ir.Node) for item in data.items)
    ):
        # ``torch.tensor([kl.sum().item(), n])`` packed for an all-reduce: each
        # entry copied out of the graph, read back as ``stats[0]``.
        return Seq([ir.detach(i, at.origin) if isinstance(i, ir.Node) else i for i in data.items])
    if isinstance(data, Unknown) and data.names:
        # ``torch.from_numpy(rb.ref_log_probs)``: the rollout's array as a
        # tensor, still named by what it holds, without a graph.
        return replace(data, text=at.code, detached=True)
    return Unknown("torch.tensor(...)", ("tensor",), call=True, detached=True)


def _as_tensor(at: TorchCall, args: Args, kwargs: Kwargs) -> Value | None:
    """``torch.as_tensor(x)``: ``x`` itself when it is already a tensor, with
    its graph (only its dtype or device may change); a copy of other data,
    as ``torch.tensor`` makes."""
    if args and isinstance(args[0], (ir.Node, Choice)) and not isinstance(args[0], ir.Const):
        return args[0]
    return _tensor(at, args, kwargs)


def _einsum(at: TorchCall, args: Args, kwargs: Kwargs) -> Value | None:
    """``torch.einsum("bt,bt->b", weight, logp)``: a product of operands
    indexed alike, summed over the trailing indices the output drops (the
    vocabulary of ``btv``, the time of ``bt``, everything for ``->``)."""
    if not args or not isinstance(args[0], Py) or not isinstance(args[0].value, str):
        return None
    spec = args[0].value.replace(" ", "")
    operands = list(args[1].items) if len(args) == 2 and isinstance(args[1], Seq) else args[1:]
    inputs, arrow, output = spec.partition("->")
    subscripts = inputs.split(",")
    summed = _triangular_einsum(at, subscripts, output, operands)
    if summed is not None:
        return summed
    if (
        not arrow
        or len(subscripts) != len(operands)
        or len(set(subscripts)) != 1
        or not subscripts[0].startswith(output)
    ):
        return None
    dropped = len(subscripts[0]) - len(output)
    picks = [o for o in operands if isinstance(o, ir.Opaque) and o.reason == ONE_HOT]
    if picks and dropped == 1 and len(subscripts[0]) == 3 and len(operands) == 2:
        # ``einsum("btv,btv->bt", logp, F.one_hot(ids, V))``: the sampled
        # token's log-prob, as ``gather`` picks it.
        (picked,) = [o for o in operands if o is not picks[0]] or [picks[0]]
        return gathered(at, picked)
    product: Value = operands[0]
    for operand in operands[1:]:
        product = at.binary("mul", product, operand)
    if dropped == 0:
        return product
    if isinstance(product, Grouped) and product.time:
        product = product.node  # the subscripts say which axes are summed
    if not output:
        return at.lift1(product, lambda n: ir.Reduce("sum", Axis.ALL, n, origin=at.origin))
    if dropped != 1:
        return None
    if len(subscripts[0]) == 3 and has_distribution(product):
        return at.lift1(product, lambda n: vocabulary_expectation("sum", n, at.origin))
    if len(subscripts[0]) == 2 or (len(subscripts[0]) == 3 and not has_distribution(product)):
        # ``bt->b``; ``bgt->bg`` of log-probs grouped by prompt (``[B, G, T]``),
        # the last axis time as in ``view(-1, G, T)``: each sample's total,
        # still grouped, so that a reduction along ``g`` is over samples.
        summed = at.lift1(product, lambda n: ir.Reduce("sum", Axis.TIME, n, origin=at.origin))
        if len(subscripts[0]) == 3 and isinstance(summed, ir.Node):
            return Grouped(summed)
        return summed
    return None


def _triangular_einsum(
    at: TorchCall, subscripts: list[str], output: str, operands: Sequence[Value]
) -> Value | None:
    """``einsum("ts,bs->bt", torch.triu(ones(T, T)), r)``: each step's sum of
    the later rewards (the reward-to-go), as ``r @ tril``. Contracting the
    matrix's second index is ``x @ matrix.T``; its first, ``x @ matrix``."""
    if len(operands) != 2 or len(subscripts) != 2:
        return None
    marked = [i for i, o in enumerate(operands) if triangular_ones(o) is not None]
    if len(marked) != 1:
        return None
    matrix, x = operands[marked[0]], operands[1 - marked[0]]
    rows_cols, batch_time = subscripts[marked[0]], subscripts[1 - marked[0]]
    if len(rows_cols) != 2 or len(batch_time) != 2 or len(output) != 2:
        return None
    contracted = batch_time[1]
    if contracted not in rows_cols or contracted in output or output[0] != batch_time[0]:
        return None
    kept = rows_cols.replace(contracted, "", 1)
    if output[1] != kept or not isinstance(x, ir.Node) or isinstance(x, ir.Opaque):
        return None
    reverse = triangular_ones(matrix)
    if contracted == rows_cols[1]:
        reverse = not reverse
    return ir.CumSum(x, reverse=bool(reverse), origin=at.origin)


ONE_HOT = "one_hot"  # ``F.one_hot(ids, V)``: a token picker over the vocabulary

TORCH_FUNCTIONS: dict[str, FunctionLowering] = {
    "einsum": _einsum,
    "segment_reduce": _segment_reduce,
    "compile": lambda at, args, kwargs: _wrapped_function(args),
    # ``torch.distributed.nn.functional.all_reduce(x, group=cp_group)``: the
    # shards of one sum (a sequence split over context-parallel ranks) added
    # up, with their gradient: the whole sum.
    "all_reduce": lambda at, args, kwargs: args[0] if args else None,
    # ``torch.distributed.nn.functional.all_gather(local)``: every rank's
    # tensor, each with its graph (``torch.cat(...).sum()`` adds them up).
    # ``dist.all_gather(chunks, local)`` writes into buffers (see calls).
    "all_gather": lambda at, args, kwargs: (
        Seq([args[0]], appended=True) if len(args) == 1 and not kwargs else None
    ),
    # ``torch.nested.nested_tensor_from_jagged(values, offsets=cu_seqlens)``:
    # the flat tokens of packed sequences as one row each.
    "nested_tensor_from_jagged": lambda at, args, kwargs: args[0] if args else None,
    # ``torch.nested.nested_tensor(pieces)`` copies the pieces into a new
    # leaf, without their graph (as ``torch.tensor`` does);
    # ``torch.nested.as_nested_tensor(pieces)`` keeps it.
    "nested_tensor": _tensor,
    "as_nested_tensor": _pad_sequence,
    "pad": _pad,
    "bmm": _bmm,
    "tensordot": _tensordot,
    "xlogy": _xlogy,
    "one_hot": lambda at, args, kwargs: ir.Opaque(ONE_HOT),
    "max": _extremum("max"),
    "min": _extremum("min"),
    "maximum": _extremum("maximum"),
    "minimum": _extremum("minimum"),
    "where": _where,
    "mse_loss": _mse_loss,
    "kl_div": _kl_div,
    "kl_divergence": _kl_divergence,
    "stack": _stack,
    # ``pad_sequence([torch.tensor(r) for r in rows], batch_first=True)``:
    # rows of different lengths stacked, as ``stack`` does.
    "pad_sequence": _pad_sequence,
    "zeros_like": _constant(0.0),
    "full_like": _full_like,
    "ones_like": _constant(1.0),
    **dict.fromkeys(NEW_TENSORS, _tensor),
    "as_tensor": _as_tensor,
    # ``nn.ModuleDict({"policy": ..., "kl": ...})``, ``nn.ModuleList([...])``:
    # the modules, held as the dict or list they are built from.
    "ModuleDict": lambda at, args, kwargs: args[0] if args else DictVal({}),
    "ModuleList": lambda at, args, kwargs: args[0] if args else Seq([], appended=True),
    "triu": _triangle("triu"),
    "tril": _triangle("tril"),
}


def torch_function(at: TorchCall, name: str, args: Args, kwargs: Kwargs) -> Value:
    """``torch.name(*args, **kwargs)`` (or ``F.name``), not a log-prob op:
    its own lowering, else the tensor method of its first argument."""
    lowering = TORCH_FUNCTIONS.get(name)
    lowered = lowering(at, args, kwargs) if lowering is not None else None
    if lowered is not None:
        return lowered
    if args:
        return tensor_method(at, name, args[0], args[1:], kwargs)
    return Unknown(at.code, (name,), call=True)


# ----------------------------------------------------------------- lowerings


def is_mask(node: ir.Node) -> bool:
    atoms = list(node.atoms())
    return (
        bool(atoms)
        and all(a.role is Role.MASK for a in atoms)
        and not any(isinstance(n, ir.Opaque) for n in node.walk())
    )


def to_token_level(node: ir.Node) -> ir.Node:
    mapping: dict[int, ir.Node] = {
        id(a): ir.Atom(a.role, a.name, ir.Level.TOKEN, per_token=a.per_token, origin=a.origin)
        for a in node.atoms()
        if a.level is ir.Level.DISTRIBUTION
    }
    return ir.substitute(node, mapping) if mapping else node


def _strip(node: ir.Node) -> ir.Node:
    while isinstance(node, ir.Unary) and node.op == "detach":
        node = node.arg
    return node


def _common_weight_factored(node: ir.Node) -> ir.Node:
    """``p * log_p - p * log_q`` (``xlogy(p, p) - xlogy(p, q)``) as
    ``p * (log_p - log_q)``."""
    if not (
        isinstance(node, ir.Binary)
        and node.op == "sub"
        and isinstance(node.left, ir.Binary)
        and isinstance(node.right, ir.Binary)
        and node.left.op == node.right.op == "mul"
    ):
        return node
    left, right = node.left, node.right
    for weight, first in ((left.left, left.right), (left.right, left.left)):
        for other, second in ((right.left, right.right), (right.right, right.left)):
            if ir.structure(weight) == ir.structure(other):
                difference = ir.Binary("sub", first, second, origin=node.origin)
                return ir.Binary("mul", weight, difference, origin=node.origin)
    return node


def _written_at(integrand: ir.Node, summed: ir.Origin) -> ir.Origin:
    """Where a divergence summed over the vocabulary is written: the call
    ``F.kl_div(..., reduction="none")`` that names it (in one branch of a
    selector, summed after the branches), when it is in the same function;
    else the sum, which completes a divergence written out by hand."""
    written = integrand.origin
    if (
        written is None
        or written.path != summed.path
        or written.function is not summed.function
        or not (
            isinstance(written.cst_node, cst.Call)
            and (dotted_name(written.cst_node.func) or "").endswith("kl_div")
        )
    ):
        return summed
    return written


def vocabulary_expectation(kind: str, node: ir.Node, origin: ir.Origin) -> ir.Node:
    """``sum_v p_v (log p_v - log q_v)`` at each position: an exact divergence
    between next-token distributions. It has no per-sample form in the IR, so
    it is lowered to the per-token surrogate with the same expected gradient
    on the sampled token y ~ pi:

    * KL(pi||pi_ref) per position: grad = E_y[logr grad log pi], as the score
      function ``sg(logr) * logp``. Summed over time on sampled prefixes it
      keeps only each token's own term of the sequence gradient (KL003).

    KL(pi_ref||pi) weighted by the reference's (a teacher's) probabilities is
    left opaque: no claim. Its gradient ``-sum_v p_ref(v) grad log pi(v)`` is
    exactly the gradient of the divergence the code writes, with no sampling
    in it, so no estimator is biased; the direction is the author's written
    choice (distillation towards a teacher). Over a top-k support it is the
    same divergence to the renormalised top-k teacher, scaled by the
    teacher's mass there. On prefixes drawn from the reference (teacher or
    data) the per-position sum is the sequence KL(pi_ref||pi) with its exact
    gradient; only where the prefixes come from pi is it not, and the code
    does not say which.

    A weighted mix of the two directions (``w * kl_forward + (1 - w) *
    kl_reverse``) is split, the sum over the vocabulary being linear: the
    KL(pi||pi_ref) part keeps its claim, scaled by its weight, and the
    reference-weighted part, exact for what it writes, adds none.

    Anything else summed over the vocabulary stays opaque (no claim)."""
    mixed = _mixed_directions(kind, node, origin)
    if mixed is not None:
        return mixed
    node = _common_weight_factored(node)
    if kind == "sum" and isinstance(node, ir.Binary) and node.op == "mul":
        for weight, difference in ((node.left, node.right), (node.right, node.left)):
            weight = _strip(weight)
            if not (isinstance(weight, ir.Unary) and weight.op == "exp"):
                continue
            if not (isinstance(difference, ir.Binary) and difference.op == "sub"):
                continue
            first, second = _strip(difference.left), _strip(difference.right)
            if ir.structure(_strip(weight.arg)) != ir.structure(first) and not (
                # A teacher's probabilities under their own name
                # (``teacher_probs = teacher_logprobs.exp()``): no gradient to tell apart.
                ir.gradient_structure(_strip(weight.arg)) == ir.gradient_structure(first)
                and {a.role for a in first.atoms()} == {Role.REFERENCE_LOGP}
            ):
                continue
            roles_of = ({a.role for a in first.atoms()}, {a.role for a in second.atoms()})
            policy = to_token_level(
                difference.left if Role.POLICY_LOGP in roles_of[0] else difference.right
            )
            reference = to_token_level(
                difference.right if Role.POLICY_LOGP in roles_of[0] else difference.left
            )
            log_ratio = ir.Binary("sub", policy, reference, origin=origin)
            if roles_of == ({Role.POLICY_LOGP}, {Role.REFERENCE_LOGP}):
                origin.estimate = "exact KL(pi||pi_ref) over the vocabulary at each position"
                # The weight carries gradient too, but sum_v grad p_v = 0 makes the
                # expectation of the score the whole story. The value is the
                # sampled log-ratio, whose expectation given the prefix is the
                # position's KL: detached and carried to earlier tokens (the
                # score function of the KL still to come) it weighs as the
                # exact KL does.
                weight = ir.detach(log_ratio, origin)
                score = ir.Binary(
                    "mul",
                    weight,
                    ir.Binary("sub", policy, ir.detach(policy, origin)),
                    origin=origin,
                )
                return ir.Binary("add", score, weight, origin=origin)
            if roles_of == ({Role.REFERENCE_LOGP}, {Role.POLICY_LOGP}):
                if not ir.depends_on_policy(node):
                    # The policy's log-probs were detached (gathered under
                    # no_grad for a metric): whichever direction the code
                    # chose, no gradient reaches the policy (KL005).
                    origin.estimate = "exact KL(pi_ref||pi) over the vocabulary at each position"
                    return ir.detach(log_ratio, origin)
                return ir.Opaque(_REFERENCE_WEIGHTED)
    return ir.Opaque(_VOCABULARY_SUM, summand=node if kind == "sum" else None)


_VOCABULARY_SUM = "a sum over the vocabulary"


def vocabulary_sums_combined(
    op: str, left: Value, right: Value, origin: ir.Origin
) -> ir.Node | None:
    """``-(pi.probs * ref.logits).sum(-1) - pi.entropy()``: two sums over the
    vocabulary, a cross-entropy and an entropy, added up into one
    (``sum_v p_v log p_v - p_v log q_v``), read as a divergence if it is one.
    None unless both sides are such sums and together they are one
    difference of two products."""
    sides = [_signed_summand(left), _signed_summand(right)]
    if sides[0] is None or sides[1] is None:
        return None
    terms = _signed_terms(sides[0][1], sides[0][0]) + _signed_terms(
        sides[1][1], sides[1][0] * (1 if op == "add" else -1)
    )
    positive = [term for sign, term in terms if sign > 0]
    negative = [term for sign, term in terms if sign < 0]
    if len(positive) != 1 or len(negative) != 1:
        return None
    difference = ir.Binary("sub", positive[0], negative[0], origin=origin)
    return vocabulary_expectation("sum", difference, origin)


def _signed_summand(value: Value) -> tuple[int, ir.Node] | None:
    sign = 1
    while isinstance(value, ir.Unary) and value.op == "neg":
        sign, value = -sign, value.arg
    if isinstance(value, ir.Opaque) and value.summand is not None:
        return sign, value.summand
    return None


def _signed_terms(node: ir.Node, sign: int) -> list[tuple[int, ir.Node]]:
    """``a - (b + c)`` as ``[(+1, a), (-1, b), (-1, c)]``."""
    if isinstance(node, ir.Unary) and node.op == "neg":
        return _signed_terms(node.arg, -sign)
    if isinstance(node, ir.Binary) and node.op in ("add", "sub"):
        right = sign if node.op == "add" else -sign
        return _signed_terms(node.left, sign) + _signed_terms(node.right, right)
    return [(sign, node)]


_REFERENCE_WEIGHTED = "an exact KL(pi_ref||pi) over the vocabulary"


def _mixed_directions(kind: str, node: ir.Node, origin: ir.Origin) -> ir.Node | None:
    if not (kind == "sum" and isinstance(node, ir.Binary) and node.op == "add"):
        return None
    kept: list[ir.Node] = []
    for piece in (node.left, node.right):
        weight, divergence = _weighted(piece)
        lowered = vocabulary_expectation(kind, divergence, origin)
        if isinstance(lowered, ir.Opaque):
            if lowered.reason != _REFERENCE_WEIGHTED:
                return None
            continue
        if isinstance(weight, ir.Const):
            if weight.value <= 0:
                return None
            lowered = ir.binary("mul", weight, lowered, origin)
        # A weight of the settings (``1 - self.mixed_kl_weight``) is a mixing
        # proportion, positive whatever its value: the part's direction stands.
        kept.append(lowered)
    if len(kept) != 1:
        return None  # both directions (or neither) of KL(pi||pi_ref): no mix to split
    origin.estimate = (
        "exact KL(pi||pi_ref) over the vocabulary at each position, mixed with KL(pi_ref||pi)"
    )
    return kept[0]


def _weighted(piece: ir.Node) -> tuple[ir.Node | None, ir.Node]:
    """``w * divergence``: a weight without gradient, and the divergence."""
    if isinstance(piece, ir.Binary) and piece.op == "mul":
        for weight, divergence in ((piece.left, piece.right), (piece.right, piece.left)):
            if not ir.depends_on_policy(weight) and ir.depends_on_policy(divergence):
                return weight, divergence
    return None, piece
