"""How torch operations lower to the KL IR: the tables of tensor methods and
functions, and the lowerings that are not one IR operation (masking with
``torch.where``, exact divergences over the vocabulary)."""

from __future__ import annotations

from kllint.analysis import ir
from kllint.analysis.ir import Role
from kllint.analysis.values import Choice, Value

TENSOR_IDENTITY = frozenset(
    {
        "float",
        "double",
        "half",
        "bfloat16",
        "to",
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
}
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


def is_mask(node: ir.Node) -> bool:
    atoms = list(node.atoms())
    return (
        bool(atoms)
        and all(a.role is Role.MASK for a in atoms)
        and not any(isinstance(n, ir.Opaque) for n in node.walk())
    )


def has_distribution(value: Value) -> bool:
    nodes = [v for _, v in value.options] if isinstance(value, Choice) else [value]
    return any(
        isinstance(n, ir.Node) and any(a.level is ir.Level.DISTRIBUTION for a in n.atoms())
        for n in nodes
    )


def to_token_level(node: ir.Node) -> ir.Node:
    mapping: dict[int, ir.Node] = {
        id(a): ir.Atom(a.role, a.name, ir.Level.TOKEN, origin=a.origin)
        for a in node.atoms()
        if a.level is ir.Level.DISTRIBUTION
    }
    return ir.substitute(node, mapping) if mapping else node


def _strip(node: ir.Node) -> ir.Node:
    while isinstance(node, ir.Unary) and node.op == "detach":
        node = node.arg
    return node


def vocabulary_expectation(kind: str, node: ir.Node, origin: ir.Origin) -> ir.Node:
    """``sum_v p_v (log p_v - log q_v)`` at each position: an exact divergence
    between next-token distributions. It has no per-sample form in the IR, so
    it is lowered to the per-token surrogate with the same expected gradient
    on the sampled token y ~ pi:

    * KL(pi||pi_ref) per position: grad = E_y[logr grad log pi], as the score
      function ``sg(logr) * logp``;
    * KL(pi_ref||pi) per position: grad = E_y[(1 - exp(-logr)) grad log pi],
      as k3 on the sampled token.

    Anything else summed over the vocabulary stays opaque (no claim)."""
    if kind == "sum" and isinstance(node, ir.Binary) and node.op == "mul":
        for weight, difference in ((node.left, node.right), (node.right, node.left)):
            weight = _strip(weight)
            if not (isinstance(weight, ir.Unary) and weight.op == "exp"):
                continue
            if not (isinstance(difference, ir.Binary) and difference.op == "sub"):
                continue
            first, second = _strip(difference.left), _strip(difference.right)
            if ir.structure(_strip(weight.arg)) != ir.structure(first):
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
                # expectation of the score the whole story.
                return ir.Binary("mul", ir.detach(log_ratio, origin), policy, origin=origin)
            if roles_of == ({Role.REFERENCE_LOGP}, {Role.POLICY_LOGP}):
                origin.estimate = "exact KL(pi_ref||pi) over the vocabulary at each position"
                minus = ir.neg(log_ratio, origin)
                return ir.Binary(
                    "sub",
                    ir.Binary(
                        "add", ir.Unary("exp", minus, origin=origin), log_ratio, origin=origin
                    ),
                    ir.Const(1.0),
                    origin=origin,
                )
    return ir.Opaque("a sum over the vocabulary")
