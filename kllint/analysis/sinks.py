"""Sinks: where a value is judged as something minimised. A value passed to
``.backward()``, returned by a loss function, or assigned to a name like a
loss is a sink; everything else the interpreter computes (logged numbers,
rewards on their way to an advantage) is judged only through a sink.

Functions over names and already-evaluated values: the interpreter asks
"is this a loss?" and records the answer as a ``Sink``."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import libcst as cst

from kllint.analysis import callers, ir, roles
from kllint.analysis.callers import Caller
from kllint.analysis.module import ModuleInfo
from kllint.analysis.project import Project
from kllint.analysis.syntax import code, named_params, string_key
from kllint.analysis.values import DictVal, Seq, Value, tensors_of


@dataclass
class Sink:
    """A value that reaches a loss."""

    value: Value
    description: str  # "`loss.backward()`", "returned by `compute_loss`", ...
    strong: bool  # backward / returned from a loss function (vs. a loss-like name)
    node: cst.CSTNode
    function: str
    function_node: cst.CSTNode | None = None
    backward: bool = False  # reaches .backward() itself
    # For a backward pass inside a helper the function calls: that call.
    # Estimates computed inside the helper are the helper's own findings.
    inlined_call: cst.CSTNode | None = None
    # And the backward call itself, inside the helper.
    inlined_backward: cst.CSTNode | None = None
    # The class whose method computed it (of ``self``'s class, for an
    # inherited method run for a subclass); None for a plain function.
    owner: str | None = None
    # Advantages or rewards stored for a loss in another call tree to read.
    read_elsewhere: bool = False


BACKWARD_METHODS = callers.BACKWARD_METHODS
# An optimiser step given the loss itself (``strategy.optimizer_step(optimizer, loss, model)``).
STEP_METHODS = callers.STEP_METHODS

# Framework entry points whose return value is the loss.
LOSS_FUNCTIONS = frozenset(
    {
        "compute_loss",
        "loss_fn",
        "loss",
        "get_loss",
        "compute_losses",
        "training_step",
        "forward_loss",
        "policy_loss",
    }
)

# ``log_loss_stats``, ``loss_scale``: functions that log or scale a loss.
NOT_A_LOSS_WORDS = frozenset(
    {
        "log",
        "logging",
        "stats",
        "metrics",
        "info",
        "scale",
        "scaler",
        "mask",
        "masks",
        "weight",
        "weights",
        "coef",
        "print",
        "plot",
        "record",
        "track",
    }
)


# What a sink is written with: a loss, an objective, a backward pass or an
# optimiser step, advantages, returns or rewards stored for a loss elsewhere.
SINK_WORDS = frozenset(
    {
        "loss",
        "losses",
        "objective",
        "objectives",
        "advantage",
        "advantages",
        "returns",
        "reward",
        "rewards",
        "experience",
        "experiences",
        *BACKWARD_METHODS,
        *STEP_METHODS,
    }
)
_FINDING_EVIDENCE: dict[str, bool] = {}


def may_hold_a_finding(module: ModuleInfo, fn: str, cls: str | None) -> bool:
    """Whether a function read on its own (an entry) can hold a finding.
    Every rule judges a term against the reference, so it (or a function of
    its module it calls) mentions what makes a value the reference's, or a
    sink, which may be given the reference by a callable kllint cannot see
    (``objective_fn(curr_logprobs, data)``). Generation code that forms
    log-probs and mentions neither is not read; one given the reference
    is read at its call."""
    return roles.sketch_mentions(
        module.sketch,
        cls,
        fn,
        module.sketch.findings,
        _finding_evidence,
    )


def _finding_evidence(identifier: str) -> bool:
    known = _FINDING_EVIDENCE.get(identifier)
    if known is None:
        known = _FINDING_EVIDENCE[identifier] = roles.reference_evidence(identifier) or bool(
            SINK_WORDS & set(roles.words(identifier))
        )
    return known


# How rollouts are kept for a later loss: a replay buffer, a queue, a list.
STORE_METHODS = frozenset({"add", "append", "extend", "put", "push", "store", "insert"})


def is_loss_name(name: str) -> bool:
    """``loss``, ``kl_loss``, ``policy_loss``, ``losses``; not ``loss_mask``."""
    ws = roles.words(name)
    # Not "objective": objectives are maximised, so their KL sign is reversed.
    return bool(ws) and ws[-1] in ("loss", "losses")


def _a_loss_entry(key: str) -> bool:
    """``loss_objective``, ``loss_kl_to_ref``: TorchRL's loss modules name
    each term they return to be summed with a ``loss_`` prefix."""
    return key.startswith("loss_") and roles.words(key)[-1:] != ["mask"]


def names_an_objective(name: str) -> bool:
    """``sequence_objective``, ``pg_kl_objective``: a value written to be
    maximised, whose caller minimises its negation."""
    return bool({"objective", "objectives"} & set(roles.words(name)))


def names_a_loss_function(name: str) -> bool:
    """``gspo_loss_seq_k3``, ``loss_with_kl``: a function that computes a loss,
    not one that logs or scales one (``log_loss_stats``, ``loss_scale``)."""
    ws = roles.words(name)
    return ("loss" in ws or "losses" in ws) and not set(ws) & NOT_A_LOSS_WORDS


def is_loss_function(
    name: str,
    class_name: str | None,
    called: Collection[str],
    *,
    selects: bool = True,
    registered: Collection[str] = (),
) -> bool:
    """Whether what a function returns is a loss, judged where it is defined.
    ``selects``: whether a parameter may pick a branch (a string default, a
    ``kind``), so that only a call site can say which estimator is used."""
    if name in registered and name not in LOSS_FUNCTIONS:
        # One of a registry the file reads by key (``KL_LOSSES[cfg.kl](...)``):
        # judged where it is looked up, with the configuration's choice.
        return False
    if (
        name in called
        and name not in LOSS_FUNCTIONS
        and (selects or not names_a_loss_function(name))
    ):
        # A helper of this file: judged at its call sites, where the
        # arguments (and so the branch and the gradient path) are known.
        # Framework entry points (compute_loss, training_step) stay losses
        # even when the file also calls them, e.g. under no_grad to evaluate;
        # so does a function named like a loss that nothing can steer
        # (``guarded_k3_loss(model, batch)``, picked by a trainer's if/elif):
        # its findings are placed at its own estimator, once.
        return False
    if name in LOSS_FUNCTIONS or is_loss_name(name) or names_a_loss_function(name):
        return True
    # A loss module this file builds (``self.kl_loss_fn = KLLoss(kind=...)``,
    # or one of a registry, ``KL_LOSSES[cfg["kl_loss"]]()``) is judged where
    # it is called, with its attributes and the configuration's choice known.
    return (
        name in ("forward", "__call__")
        and class_name is not None
        and _names_a_loss_class(class_name)
        and class_name not in called
        and class_name not in registered
    )


def _names_a_loss_class(name: str) -> bool:
    """``KLLoss``, ``PolicyLoss``; NeMo-RL's ``ClippedPGLossFn`` too."""
    ws = roles.words(name)
    while ws and ws[-1] in ("fn", "func", "function"):
        ws = ws[:-1]
    return bool(ws) and ws[-1] in ("loss", "losses")


def is_advantage_function(name: str) -> bool:
    """``compute_grpo_advantage``, ``compute_advantages``: what it returns
    weights the policy's log-probs in a policy-gradient loss, wherever that
    loss reads it back (from stored batch data, in another module)."""
    return _computes(name, {"advantage", "advantages"})


def is_returns_function(name: str) -> bool:
    """``compute_returns``: the rewards-to-go a REINFORCE-style loss weights
    the log-probs by."""
    return _computes(name, {"returns"})


def _computes(name: str, what: set[str]) -> bool:
    ws = roles.words(name)
    return (
        bool(ws)
        and ws[0] in ("compute", "get", "calc", "calculate", "estimate", "make")
        and bool(set(ws) & what)
        and not set(ws) & NOT_A_LOSS_WORDS
    )


def is_advantage_field(name: str) -> bool:
    """A field of a rollout record that a later loss reads as advantages
    (``Experience.advantages``, ``Experience.returns``)."""
    return bool(set(roles.words(name)) & {"advantage", "advantages", "returns"})


def is_advantage_key(name: str) -> bool:
    """A key or field that holds advantages (``"advantages"``, ``token_advantages``)."""
    return bool(set(roles.words(name)) & {"advantage", "advantages"})


def stored_advantages(target: cst.BaseExpression) -> str | None:
    """``rollout_data["advantages"]``, ``batch.advantages``: a place where a
    loss in another call tree reads advantages back (how it is written), else
    None."""
    key = _stored_key(target)
    return code(target) if key is not None and is_advantage_key(key) else None


def stored_returns(target: cst.BaseExpression) -> str | None:
    """``batch["returns"] = discounted_returns(rewards, ...)``: what a
    REINFORCE-style loss reads back as its advantages when no advantages
    are stored beside them (beside them, returns are a critic's targets)."""
    key = _stored_key(target)
    return code(target) if key is not None and is_returns_key(key) else None


def gives_returns(function: str) -> bool:
    """``cumulative_returns``, ``compute_gae_advantages``, ``discounted_returns``:
    a function named for the returns or advantages it gives back."""
    ws = roles.words(function.rpartition(".")[2])
    return bool(ws) and ws[-1] in ("returns", "advantages", "advantage")


def is_returns_key(name: str) -> bool:
    """``"returns"``: what a REINFORCE-style loss weights the log-probs by
    when no advantages are kept beside them."""
    return roles.words(name) == ["returns"]


def makes_rewards(name: str) -> bool:
    """``compute_rewards``, ``get_reward``: a function that returns rewards;
    ``make_experience``: one that returns a rollout's rewards and statistics."""
    return bool(set(roles.words(name)) & {"reward", "rewards", "experience", "experiences"})


def is_rewards_key(name: str) -> bool:
    """``rewards``, ``token_level_rewards``; not a dict of reward metrics."""
    words = set(roles.words(name))
    return bool(words & {"reward", "rewards"}) and "metrics" not in words


def stored_rewards(target: cst.BaseExpression) -> str | None:
    """``batch["token_level_rewards"]``, ``data.rewards``: per-token rewards
    written for a loss in another call tree to credit (how it is written),
    else None."""
    key = _stored_key(target)
    if key is None or is_advantage_key(key) or not is_rewards_key(key):
        return None
    return code(target)


def _stored_key(target: cst.BaseExpression) -> str | None:
    """The key a value is stored under for a loss to read back; None for a
    store into what holds metrics (``self.metrics["actor/reward_kl"] = ...``)."""
    # By class (LibCST's are final): asked of every store, and an ABC's
    # ``isinstance`` is a Python call.
    if type(target) is cst.Subscript:
        holder, key = target.value, string_key(target)
    elif type(target) is cst.Attribute:
        holder, key = target.value, target.attr.value
    else:
        return None
    if set(roles.words(_last_name(holder))) & _METRIC_HOLDERS:
        return None
    return key


def _last_name(expr: cst.BaseExpression) -> str:
    if isinstance(expr, cst.Attribute):
        return expr.attr.value
    return expr.value if isinstance(expr, cst.Name) else ""


# What holds numbers to log, never data a loss reads back.
_METRIC_HOLDERS = frozenset(
    {
        "metrics",
        "metric",
        "stats",
        "statistics",
        "log",
        "logs",
        "logging",
        "info",
        "summary",
        "scalars",
    }
)


def returned_losses(
    function_name: str,
    returned: cst.BaseExpression | None,
    value: Value,
    *,
    description: str | None = None,
    elements: tuple[int, ...] | None = None,
) -> list[tuple[Value, str]]:
    """The parts of a loss function's return value that are losses, each with
    how it reaches the loss. ``elements``: the positions in a returned tuple
    that callers backpropagate (``pg_loss, clipfrac, kl = helper(...)``)."""
    description = description or f"the value returned by `{function_name}`"
    if elements is not None and isinstance(value, Seq):
        return [(value.items[i], description) for i in elements if i < len(value.items)]
    if isinstance(value, DictVal):
        return [
            (item, f"{description} as `{key}`")
            for key, item in value.items.items()
            if is_loss_name(key) or _a_loss_entry(key)
        ]
    if isinstance(value, Seq) and value.items and isinstance(returned, (cst.Tuple, cst.List)):
        # ``return loss, metrics``: the elements named like a loss, else the first.
        written = [e.value for e in returned.elements]
        named = [
            v
            for e, v in zip(written, value.items)
            if isinstance(e, cst.Name) and is_loss_name(e.value)
        ]
        return [(item, description) for item in named or value.items[:1]]
    return [(value, description)]


# A parameter with one of these words may pick the estimator at the call
# (``kl_type="k3"``): such a helper is judged at its calls, with the argument.
_STEERING_WORDS = frozenset(
    {"kind", "type", "mode", "variant", "estimator", "penalty", "approx", "method"}
)


def backprop_caller(
    project: Project, path: Path, fn: cst.FunctionDef, class_name: str | None = None
) -> Caller | None:
    """A caller in another file (or a pipeline given it as its loss callback)
    that backpropagates what ``fn`` returns, so that ``fn`` is judged where it
    is written: once, with the caller named in the finding. A module's
    ``forward`` (or an object's ``__call__``) is called through an attribute
    holding an object of its class (``self.kl_penalty(...)``). None when a
    parameter may choose the estimator: then only a call site can say which."""
    if steerable(fn):
        return None
    here = str(path.resolve())
    found = project.backprop_callers(path, fn.name.value)
    if class_name is not None and fn.name.value in ("forward", "__call__"):
        found = [*project.backprop_callers(path, callers.instance_call(class_name)), *found]
    for caller in found:
        if caller.callback or (caller.path != here and not caller.local):
            return caller
    return None


def backpropagated_elements(
    project: Project, path: Path, function_name: str, value: Value
) -> tuple[tuple[int, ...], Caller] | None:
    """The elements of a returned tuple that callers anywhere in the project
    backpropagate (``per_token_loss = pg_loss + beta * kl`` after
    ``pg_loss, clipfrac, kl = compute_grpo_loss(...)``): a loss function's
    caller decides which of its results are losses, not their names."""
    if not (isinstance(value, Seq) and may_hold_kl(value)):
        return None
    here = str(path.resolve())
    callers = [
        c
        for c in project.backprop_callers(path, function_name)
        if c.elements and (c.path == here or not c.local)  # a namesake's caller calls its own
    ]
    used = {position for caller in callers for position in caller.elements or ()}
    return (tuple(sorted(used)), callers[0]) if used else None


def steerable(fn: cst.FunctionDef) -> bool:
    """A parameter may choose the estimator (a string default, ``kl_type``)."""
    for param in named_params(fn):
        if isinstance(param.default, (cst.SimpleString, cst.ConcatenatedString)):
            return True
        if set(roles.words(param.name.value)) & _STEERING_WORDS and not (
            # ``kl_penalty_coef=0.05``: how much of the penalty, not which.
            roles.has_words(param.name.value, roles.COEFFICIENT_WORDS)
            or isinstance(param.default, cst.Float)
        ):
            return True
    return False


def caller_description(caller: Caller, function_name: str) -> str:
    """``returned by `per_token_terms` to `train_step` (trainer.py:41), which calls `.backward()```."""
    where = f"{_shown(caller.path)}:{caller.line}"
    if caller.callback:
        return f"`{function_name}`, which `{caller.function}` ({where}) {caller.via}"
    return (
        f"the value returned by `{function_name}` to `{caller.function}` ({where}), "
        f"which {caller.via}"
    )


def _shown(path: str) -> str:
    try:
        return Path(path).relative_to(Path.cwd()).as_posix()
    except ValueError:
        return Path(path).name


def may_hold_kl(value: Value) -> bool:
    """Whether a value mentions a reference policy's log-probs: only then is
    it worth asking who backpropagates it."""
    return any(node.has_role(ir.Role.REFERENCE_LOGP) for node in tensors_of(value))


def carries_the_policys_gradient(value: Value) -> bool:
    """Whether a value holds the policy's log-probs with their gradient:
    written into a container (``mb["log_prob"] = log_prob``), a loss reading
    them back must not take them for stored rollout data."""
    return any(ir.depends_on_policy(node) for node in tensors_of(value))


def backward_description(call_code: str, method: str) -> str:
    """How a ``.backward()`` call is named in messages."""
    return f"`{call_code}`" if len(call_code) < 60 else f"`.{method}()`"
