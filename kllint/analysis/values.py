"""The abstract values of the interpreter, and the branch conditions they
carry.

A name maps to an IR node (a tensor expression), a Python literal (a
selector), a ``Choice`` between values when a branch cannot be decided, a
sequence, a dict, a function, or an ``Unknown`` that becomes an atom once
evidence says what it is. A ``Choice`` labels each alternative with the
conjunction of the branch conditions that lead to it; conditions that cannot
select an estimator (an entropy flag) are kept, to combine correlated
choices, but hidden from messages.
"""

from __future__ import annotations

import ast
import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import libcst as cst

from kllint.analysis import ir
from kllint.analysis.module import ClassInfo, ModuleInfo, Unparsed, decorator_names

MAX_OPTIONS = 16

# --------------------------------------------------------------------- values


@dataclass(frozen=True)
class Py:
    """A Python literal: a selector string, a bool flag, an int index, None."""

    value: object
    source: str | None = None  # where a config default came from


@dataclass
class Choice:
    """Alternatives the analysis cannot decide between, each with the
    condition under which it is taken."""

    options: list[tuple[str, Value]]


@dataclass
class Seq:
    items: list[Value]
    appended: bool = False  # a list built by ``.append``: one item per row or step
    # Pieces of a packed tensor cut by length (``x.split(seq_lens)``): each
    # item one response's tokens, whose one axis is time.
    sequences: bool = False
    # Buffers a collective wrote copies into (``dist.all_gather(chunks, x)``).
    gathered: bool = False
    # What a generator yields, in order: a loop over it runs for each.
    generated: bool = False


@dataclass
class DictVal:
    items: dict[str, Value]
    # A ``NamedTuple``'s fields in order: it unpacks (``_, per_seq = out``)
    # and indexes by position as a tuple does.
    positional: tuple[str, ...] = ()


def written_attribute(owner: str, attr: str) -> str:
    """The name under which a function's environment keeps what it wrote
    to ``<owner>.<attr>`` (``self.kl``, ``experience.returns``; never a
    Python identifier, so never a local's)."""
    return f"{owner}.{attr}"


def dict_key(value: object) -> str | None:
    """The key under which a dict kllint holds keeps an entry: a string as it
    is; an int (an ``IntEnum`` member's value, ``{KLEstimator.K3: _kl_k3}``)
    marked so that it never equals a string key; None for other keys."""
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return f"{_INT_KEY}{value!r}"
    return None


def shown_key(key: str) -> object:
    """A key as the code writes it (for messages)."""
    return int(key[len(_INT_KEY) :]) if key.startswith(_INT_KEY) else key


_INT_KEY = "\x00int:"


@dataclass
class Flipped:
    """``torch.flip`` along time of a node: kept apart so that
    ``flip(cumsum(flip(x)))`` becomes the reverse cumulative sum."""

    node: ir.Node


@dataclass
class Grouped:
    """``rewards.view(-1, n)``: samples regrouped by prompt (GRPO, RLOO), so
    that a reduction along any axis of it is over samples, not over time.
    With ``time``, token values regrouped as ``[B, G, T]``
    (``logp.view(-1, G, T)``): the last axis is time, the others samples."""

    node: ir.Node
    time: bool = False


@dataclass
class Unknown:
    """A value the interpreter cannot compute, with the evidence needed to
    decide later what it is: the names along its attribute/subscript/call
    chain, whether it was read from stored rollout data, whether a reference
    model produced it."""

    text: str
    names: tuple[str, ...]
    call: bool = False  # the result of calling something
    stored: bool = False  # read from a rollout container
    reference_model: bool = False  # computed by a model named ref/base/initial
    logprob_op: bool = False  # produced by log_softmax/gather/log_prob & co.
    detached: bool = False
    module: str | None = None  # an imported module or name it refers to
    numpy: bool = False  # a NumPy (or other non-autograd) array
    distribution: bool = False  # log_softmax over the vocabulary, not gathered
    class_name: str | None = None  # a class of this module (an Enum, a constants class)
    # Cut along time (``logits[:, start:end]``): per token of a sequence.
    per_token: bool = False
    # The container this one is another name for: a variable assigned from
    # it (``data = apply_kl_penalty(data, ...)``), or the rows of a sequence
    # kllint does not hold (``for mb in micro_batches``). What is written into
    # one by key (``mb["ref_tok"] = ...``) is read back from the others.
    same_as: object | None = field(default=None, compare=False, repr=False)
    # A feature flag's default in the settings (``use_kl_loss: true``): the
    # flag stays open, the path its default takes is preferred when two
    # findings on one expression compete (``note_default``).
    default_flag: bool | None = field(default=None, compare=False, repr=False)


@dataclass
class Instance:
    """An object of a class of the project (``KLLoss(kind="low_var_kl")``):
    the attributes its ``__init__`` set, so that its methods see them."""

    cls: ClassInfo
    module: ModuleInfo
    attrs: dict[str, Value] = field(default_factory=dict)
    # Its ``__init__``, run when an attribute is first read: most objects
    # a trainer builds (a model's layers) are never read again.
    pending: Callable[[], None] | None = field(default=None, compare=False, repr=False)
    # Known only by its type (``loss_fn: GRPOLoss``): built by a caller kllint
    # did not see, so its attributes are what ``__init__`` gives by default.
    unbuilt: bool = False

    def built(self) -> dict[str, Value]:
        """The attributes, once ``__init__`` has run."""
        if self.pending is not None:
            run, self.pending = self.pending, None
            run()
        return self.attrs


@dataclass
class FuncRef:
    # The function, or where it is written while LibCST has not parsed it:
    # most functions a lookup finds are never followed (see ``node``).
    definition: cst.FunctionDef | Unparsed
    module: ModuleInfo
    cls: ClassInfo | None = None
    bound: bool = False  # called as self.method(...)
    # ``functools.partial(f, *args, **kwargs)``: arguments given in advance.
    preset_args: tuple[Value, ...] = ()
    preset_kwargs: dict[str, Value] = field(default_factory=dict)
    receiver: Instance | None = None  # the object a bound method is called on
    # The locals of the function a nested ``def`` or ``lambda`` was written in,
    # read when it is called (late, as Python's closures are): ``kl_fn`` and
    # ``cfg`` in a ``loss_fn`` that a factory returns.
    closure: Callable[[], dict[str, Value]] | None = field(default=None, compare=False, repr=False)

    @property
    def node(self) -> cst.FunctionDef:
        if isinstance(self.definition, Unparsed):
            self.definition = cast(cst.FunctionDef, self.definition.parse())
        return self.definition

    @property
    def name(self) -> str:
        if isinstance(self.definition, Unparsed):
            return self.definition.name
        return self.definition.name.value

    @property
    def parsed(self) -> bool:
        return not (isinstance(self.definition, Unparsed) and not self.definition.parsed)

    @property
    def is_property(self) -> bool:
        """A ``@property`` (or ``cached_property``), told from the text while
        the method is not parsed: a lookup must not parse what it does not follow."""
        if self.parsed:
            return bool(decorator_names(self.node) & {"property", "cached_property"})
        source = self.module.source
        if "property" not in source:
            return False
        pattern = (
            r"@(?:\w+\.)*(?:cached_)?property[ \t]*\n(?:[ \t]*@.*\n)*[ \t]*"
            rf"(?:async[ \t]+)?def[ \t]+{re.escape(self.name)}\b"
        )
        return re.search(pattern, source) is not None


Value = ir.Node | Py | Choice | Seq | DictVal | Flipped | Grouped | Unknown | FuncRef | Instance


# ----------------------------------------------------------------- arithmetic

NodeOf = Callable[[Value], ir.Node]  # any value as an IR node (the interpreter's ``as_node``)


def lift1(value: Value, fn: Callable[[ir.Node], ir.Node], as_node: NodeOf) -> Value:
    """An elementwise operation on a value: on each alternative of a choice."""
    if isinstance(value, Choice):
        return choice([(label, lift1(v, fn, as_node)) for label, v in value.options])
    if isinstance(value, Flipped):
        return Flipped(fn(value.node))  # elementwise ops commute with a flip
    if isinstance(value, Grouped):
        return Grouped(fn(value.node), value.time)
    return fn(as_node(value))


def lift2(
    left: Value, right: Value, fn: Callable[[ir.Node, ir.Node], ir.Node], as_node: NodeOf
) -> Value:
    """A binary elementwise operation: on each consistent pair of alternatives."""
    if isinstance(left, Choice) or isinstance(right, Choice):
        lefts = left.options if isinstance(left, Choice) else [("", left)]
        rights = right.options if isinstance(right, Choice) else [("", right)]
        # Choices that come from the same branch are correlated: combine
        # only the alternatives whose conditions are consistent.
        combos = [
            (label, a, b)
            for (la, a), (lb, b) in itertools.product(lefts, rights)
            if (label := join_conditions(la, lb)) is not None
        ][:MAX_OPTIONS]
        return choice([(label, lift2(a, b, fn, as_node)) for label, a, b in combos])
    if isinstance(left, Grouped) or isinstance(right, Grouped):
        # ``grouped - grouped.mean(-1, keepdim=True)``: still grouped.
        ungrouped = [v.node if isinstance(v, Grouped) else as_node(v) for v in (left, right)]
        tokens = any(isinstance(v, Grouped) and v.time for v in (left, right))
        return Grouped(fn(ungrouped[0], ungrouped[1]), tokens)
    if isinstance(left, Flipped) and isinstance(right, Flipped):
        return Flipped(fn(left.node, right.node))
    if isinstance(left, Flipped) or isinstance(right, Flipped):
        other = right if isinstance(left, Flipped) else left
        other_node = as_node(other)
        if not any(
            a.role
            in (ir.Role.POLICY_LOGP, ir.Role.REFERENCE_LOGP, ir.Role.OLD_LOGP, ir.Role.ADVANTAGE)
            for a in other_node.atoms()
        ):
            # A mask or a coefficient broadcast over time commutes with the flip.
            if isinstance(left, Flipped):
                return Flipped(fn(left.node, other_node))
            assert isinstance(right, Flipped)
            return Flipped(fn(other_node, right.node))
        return ir.Opaque("flipped tensor mixed with an unflipped one")
    return fn(as_node(left), as_node(right))


def binary(op: str, left: Value, right: Value, origin: ir.Origin, as_node: NodeOf) -> Value:
    """``left op right``: string concatenation, else an IR operation."""
    if isinstance(left, Py) and isinstance(right, Py) and op == "add":
        if isinstance(left.value, str) and isinstance(right.value, str):
            return Py(left.value + right.value)
    return lift2(left, right, lambda a, b: ir.binary(op, a, b, origin), as_node)


def tensors_of(value: Value) -> list[ir.Node]:
    """The IR nodes a value holds: itself, each branch of a choice, each item
    of a sequence or a dict."""
    if isinstance(value, ir.Node):
        return [value]
    if isinstance(value, Choice):
        return [node for _, option in value.options for node in tensors_of(option)]
    if isinstance(value, Seq):
        return [node for item in value.items for node in tensors_of(item)]
    if isinstance(value, DictVal):
        return [node for item in value.items.values() for node in tensors_of(item)]
    return []


def has_distribution(value: Value) -> bool:
    """Whether a value holds log-probs over the whole vocabulary (not gathered)."""
    nodes = [v for _, v in value.options] if isinstance(value, Choice) else [value]
    return any(
        isinstance(n, ir.Node) and any(a.level is ir.Level.DISTRIBUTION for a in n.atoms())
        for n in nodes
    )


def choice(options: list[tuple[str, Value]]) -> Value:
    flat: list[tuple[str, Value]] = []
    for label, value in options:
        if isinstance(value, Choice):
            for inner_label, inner in value.options:
                joined = join_conditions(label, inner_label)
                if joined is not None:
                    flat.append((joined, inner))
        else:
            flat.append((label, value))
    # Unrelated branches (an entropy flag, a padding mode) multiply the
    # alternatives without changing the KL term: keep one of each shape.
    # The same value on several paths holds under what those paths share.
    distinct: list[tuple[str, Value]] = []
    position: dict[object, int] = {}
    for label, value in flat:
        key = ir.structure(value) if isinstance(value, ir.Node) else id(value)
        if key in position:
            kept_label, kept = distinct[position[key]]
            shared = set(label.split(AND))
            distinct[position[key]] = (
                AND.join(c for c in kept_label.split(AND) if c in shared),
                kept,
            )
        else:
            position[key] = len(distinct)
            distinct.append((label, value))
    flat = distinct[:MAX_OPTIONS]
    if not flat:
        return Unknown("empty choice", ("empty",))
    if len(flat) == 1:
        return flat[0][1]
    first = flat[0][1]
    if all(value is first or same_value(value, first) for _, value in flat):
        return first
    return Choice(flat)


def same_value(a: Value, b: Value) -> bool:
    """Structurally equal tensor expressions (the same atoms and operations)."""
    if isinstance(a, ir.Node) and isinstance(b, ir.Node):
        return ir.structure(a) == ir.structure(b)
    return False


AND = "\x00"  # separates the conjuncts of a branch condition; shown as " and "


def join_conditions(a: str, b: str) -> str | None:
    """The conjunction of two branch conditions, None if they contradict."""
    conjuncts = [c for c in a.split(AND) if c]
    for c in b.split(AND):
        if not c or c in conjuncts:
            continue
        if negate_condition(c) in conjuncts or any(_exclusive(c, d) for d in conjuncts):
            return None
        conjuncts.append(c)
    return AND.join(conjuncts)


def settings_agree(a: str, b: str) -> bool:
    """Whether some setting takes both paths: their tests of selectors'
    values do not contradict (``kl_placement == "reward"`` and
    ``kl_placement == "loss"`` do), whatever feature flags each needs on
    or off, since a setting can turn every flag on."""
    tests = [
        AND.join(c for c in label.split(AND) if c and _literal_test(c) is not None)
        for label in (a, b)
    ]
    return join_conditions(*tests) is not None


def _exclusive(a: str, b: str) -> bool:
    """Two tests of one selector that no value passes both of:
    ``kind in ("kl", "k1")`` and ``kind == "abs"``, or ``kind == "k3"`` and
    ``not (kind in ("k3", "low_var_kl"))``. A selector read twice (once per
    step of a loop) must not combine the k1 branch of one read with the k3
    branch of the other."""
    first, second = _literal_test(a), _literal_test(b)
    if first is None or second is None or first[0] != second[0]:
        return False
    (_, passes_a, values_a), (_, passes_b, values_b) = first, second
    if passes_a and passes_b:
        return not values_a & values_b
    if passes_a != passes_b:
        kept = values_a if passes_a else values_b
        excluded = values_b if passes_a else values_a
        return kept <= excluded
    return False


_LITERAL_TESTS: dict[str, tuple[str, bool, frozenset[object]] | None] = {}


def _literal_test(condition: str) -> tuple[str, bool, frozenset[object]] | None:
    """``subject == literal`` or ``subject in (literals)``, possibly negated:
    (subject, whether it must pass, the literals)."""
    if condition not in _LITERAL_TESTS:
        text = condition.lstrip(HIDDEN)
        passes = not (text.startswith("not (") and text.endswith(")"))
        body = text if passes else text[5:-1]
        test = None
        for operator in (" == ", " in "):
            subject, found, literal = body.partition(operator)
            if not found or not subject.strip().replace(".", "_").isidentifier():
                continue
            try:
                parsed = ast.literal_eval(literal.strip())
            except (ValueError, SyntaxError, RecursionError):
                break
            values = parsed if operator == " in " else (parsed,)
            if isinstance(values, (tuple, list, set, frozenset)) and all(
                isinstance(v, (str, int)) for v in values
            ):
                test = (subject.strip(), passes, frozenset(values))
            break
        _LITERAL_TESTS[condition] = test
    return _LITERAL_TESTS[condition]


HIDDEN = "\x01"  # marks a condition that is not shown (an unrelated flag)


def negate_condition(condition: str) -> str:
    hidden = condition.startswith(HIDDEN)
    text = condition.lstrip(HIDDEN)
    negated = text[5:-1] if text.startswith("not (") and text.endswith(")") else f"not ({text})"
    return HIDDEN + negated if hidden else negated


def show_condition(label: str) -> str:
    """The visible conjuncts of a branch condition. ``not (kind == "k1") and
    kind == "k3"`` reads ``kind == "k3"``: a positive test on a selector makes
    the negative ones on the same selector redundant."""
    shown = [c for c in label.split(AND) if c and not c.startswith(HIDDEN)]
    positive = {_subject(c) for c in shown if not c.startswith("not (")}
    return " and ".join(
        c for c in shown if not (c.startswith("not (") and _subject(c[5:-1]) in positive - {None})
    )


def common_condition(labels: list[str]) -> str:
    """What every path to a finding has in common, shown."""
    sets = [set(label.split(AND)) - {""} for label in labels]
    shared = set.intersection(*sets) if sets else set()
    ordered = [c for c in labels[0].split(AND) if c in shared] if labels else []
    return show_condition(AND.join(ordered))


def _subject(condition: str) -> str | None:
    for operator in (" == ", " in ", " is "):
        if operator in condition:
            return condition.split(operator, 1)[0].strip()
    return None


def _one_container(a: Value, b: Value) -> bool:
    """Two names for one container: ``data = apply_kl_penalty(data)`` on one
    path rebinds the container it was given."""
    return (
        isinstance(a, Unknown) and isinstance(b, Unknown) and (a.same_as or a) is (b.same_as or b)
    )


def merge_envs(
    then_env: dict[str, Value], else_env: dict[str, Value], label: str
) -> dict[str, Value]:
    merged: dict[str, Value] = {}
    for name in then_env.keys() | else_env.keys():
        a, b = then_env.get(name), else_env.get(name)
        if a is None or b is None or a is b or _one_container(a, b):
            merged[name] = a if a is not None else b  # type: ignore[assignment]
        elif isinstance(a, DictVal) and isinstance(b, DictVal):
            merged[name] = a
        else:
            merged[name] = choice([(label, a), (negate_condition(label), b)])
    return merged


# Branch conditions on feature flags whose settings give a default, with the
# truth value the default gives them (and their negations): for the file
# being analysed.
_FLAG_DEFAULTS: dict[str, bool] = {}


def note_default(condition: str, value: bool) -> None:
    _FLAG_DEFAULTS[condition] = value
    _FLAG_DEFAULTS[negate_condition(condition)] = not value


# Of those, the flags that choose between two implementations of one KL
# (``if use_legacy_kl: ... else: ...``, both branches reading the reference).
_ALTERNATIVES: set[str] = set()


def note_alternatives(condition: str) -> None:
    _ALTERNATIVES.add(condition)
    _ALTERNATIVES.add(negate_condition(condition))


def off_the_default_implementation(label: str) -> bool:
    """Whether a path takes an implementation the flags' defaults do not."""
    return any(c in _ALTERNATIVES and _FLAG_DEFAULTS.get(c) is False for c in label.split(AND))


def against_defaults(label: str) -> int:
    """How many conditions of a path contradict the flags' defaults."""
    return sum(1 for c in label.split(AND) if _FLAG_DEFAULTS.get(c) is False)


def default_of(condition: str) -> bool | None:
    """The truth value the settings' defaults give a shown condition."""
    return _FLAG_DEFAULTS.get(condition, _FLAG_DEFAULTS.get(HIDDEN + condition))


def clear_defaults() -> None:
    _FLAG_DEFAULTS.clear()
    _ALTERNATIVES.clear()
