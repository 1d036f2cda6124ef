"""The state of one function being interpreted: its file, module and class,
its locals, whether gradient is off, the branch conditions on the current
path, and where what it computes is reported (its own lines, or the call
site of the helper it was inlined into).

The methods the other parts of the interpreter share live here: turning any
value into an IR node, lifting tensor operations over choices, asking the
role evidence what an unknown value is. The three parts are layered classes,
one per file: ``Frame`` (this state), ``Expressions`` (``expressions.py``),
``Calls`` (``calls.py``) and ``Interpreter`` (``interpreter.py``: statements,
branches, loops and inlining)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst

from kllint.analysis import ir, roles
from kllint.analysis.lowering import TorchCall, vocabulary_sums_combined
from kllint.analysis.module import TRIPLE_QUOTED, ClassInfo, ModuleInfo, outside_tests
from kllint.analysis.project import Project
from kllint.analysis.sinks import Sink
from kllint.analysis.values import (
    Flipped,
    FuncRef,
    Grouped,
    Py,
    Unknown,
    Value,
    binary,
    lift1,
    lift2,
)

MAX_DEPTH = 4  # helpers inlined inside helpers, at most


@dataclass
class FileContext:
    """What every frame of one file shares: where the file is, the project,
    the role patterns, the sinks found so far."""

    path: str  # as displayed
    fs_path: Path
    module: ModuleInfo
    project: Project
    role_patterns: roles.RolePatterns
    sinks: list[Sink] = field(default_factory=list)
    calls: Counter[str] = field(default_factory=Counter)  # calls written in this file, by name
    registered: frozenset[str] = frozenset()  # what this file stores in a registry it reads
    # The enclosing function's locals of each nested ``def`` of this file
    # (by node id), from that function's own analysis: what the nested
    # function, analysed on its own after it, closes over.
    closures: dict[int, Callable[[], dict[str, Value]]] = field(default_factory=dict)
    # KL-bearing values written by key into a container kllint does not hold
    # (``batch["token_level_rewards"] = scores - beta * kl``), by the
    # container's value: what a helper writes into its argument, its caller
    # reads back.
    written: dict[int, tuple[object, dict[str, Value]]] = field(default_factory=dict)
    # Values stored by key by one function of the file, for another that reads
    # them back from its own batch, by key: a KL estimate under a key named as
    # one (``data.batch["ref_kl"]``, a driver's reward step and a worker's
    # loss), and log-probs computed as the reference's under
    # ``model.disable_adapter()``, whatever the key says (``inputs["prev_logps"]``).
    shared_entries: dict[str, Value] = field(default_factory=dict)
    # One object for each attribute of a container kllint does not hold
    # (``data.batch``), however often and under whichever name it is read:
    # what a helper writes into ``data.batch["token_level_rewards"]``, its
    # caller reads back from ``batch.batch["token_level_rewards"]``.
    attributes: dict[tuple[int, str], tuple[object, object]] = field(default_factory=dict)
    # Settings named like coefficients whose every default is negative, by name.
    negative_coefficients: dict[str, bool] = field(default_factory=dict)

    def calls_anywhere(self, name: str) -> bool:
        """Whether the file calls ``name`` through any receiver
        (``self.experience_maker.make_returns(...)``), not only as ``self.name``
        or a bare name, as ``calls`` counts them."""
        return bool(self.calls.get(name)) or self.calls_through_any(name) > 0

    def calls_through_any(self, name: str) -> int:
        """How many calls of ``name`` the file writes, through any receiver
        (a docstring that shows a call calls nothing)."""
        source = TRIPLE_QUOTED.sub('""', outside_tests(self.module.source))
        return len(re.findall(rf"(?<!def )(?<![\w]){re.escape(name)}\s*\(", source))

    def write(self, container: Value, key: str, value: Value) -> None:
        held = _held(container)
        entry = self.written.get(id(held))
        if entry is None or entry[0] is not held:
            entry = self.written[id(held)] = (held, {})
        entry[1][key] = value
        self.keep_kl_entry(key, value)

    def keep_kl_entry(self, key: str, value: Value) -> None:
        """A value stored under a key named as a KL (``"ref_kl"``, a record's
        ``kl`` field), for another function of the file to read back."""
        if roles.has_words(key, roles.KL_WORDS):
            self.shared_entries[key] = value

    def read(self, container: Value, key: str) -> Value | None:
        held = _held(container)
        entry = self.written.get(id(held))
        if entry is not None and entry[0] is held and key in entry[1]:
            return entry[1][key]
        return self.shared_entries.get(key)

    def attribute_of(self, container: Value, attr: str) -> object:
        """What ``container.attr`` is another name for (see ``attributes``)."""
        held = _held(container)
        found = self.attributes.get((id(held), attr))
        if found is None or found[0] is not held:
            found = self.attributes[(id(held), attr)] = (held, object())
        return found[1]

    def entries(self, container: Value) -> dict[str, Value]:
        """Everything written by key into a container kllint does not hold."""
        held = _held(container)
        entry = self.written.get(id(held))
        return dict(entry[1]) if entry is not None and entry[0] is held else {}


def _held(container: Value) -> object:
    """What a write by key is kept under: the container's own value, or the
    one it is another name for."""
    if isinstance(container, Unknown) and container.same_as is not None:
        return container.same_as
    return container


# --------------------------------------------------------------------- frame


class Frame:
    """One function being interpreted (or the module's top level)."""

    def __init__(
        self,
        context: FileContext,
        module: ModuleInfo,
        cls: ClassInfo | None = None,
        *,
        depth: int = 0,
        call_site: ir.Origin | None = None,
        stack: tuple[int, ...] = (),
        function_name: str = "<module>",
        self_class: tuple[ClassInfo, ModuleInfo] | None = None,
    ) -> None:
        self.context = context
        self.module = module
        self.cls = cls
        # The class of ``self`` and its module: a subclass's, when a method it
        # inherits runs for it (``self.kl_penalty`` is then its override).
        self.self_class = self_class or ((cls, module) if cls is not None else None)
        self.depth = depth
        self.call_site = call_site
        # The call in the analysed function this helper was reached from,
        # also when its nodes keep their own places (a helper of the same file).
        self.entry_call = call_site
        self.stack = stack
        self.function_name = function_name
        self.env: dict[str, Value] = {}
        self.no_grad = False
        # Inside ``with model.disable_adapter():``: the model is the reference.
        self.on_reference = False
        # Under ``torch.inference_mode()``, which ``enable_grad`` cannot undo.
        self.inference_mode = False
        # Inside a loop run once per term (``terms_to_unroll``): a loop in it
        # runs once, so that nested loops over terms cost no product.
        self.unrolling = False
        self.path: list[str] = []
        self.returns: list[tuple[str, Value]] = []
        # What a generator yields, in order (``yield loss`` per micro-batch,
        # ``yield from`` another's): its caller's loop takes each.
        self.yielded: list[Value] = []
        # Loop iterables already evaluated, by node id (a generator's call is
        # run once, for its rows and for the loop's target).
        self.iterated: dict[int, Value] = {}
        # Loop variables bound to one response of a packed tensor
        # (``for x in log_ratio.split(response_lengths)``): their one axis is time.
        self.sequence_rows: set[str] = set()
        # Names holding such responses, cut apart before a loop takes them
        # (``lp_chunks = torch.split(logp, input_lengths)``).
        self.sequence_splits: dict[str, Value] = {}
        # ``rollout_data["advantages"] = advantages``: advantages written for
        # a loss elsewhere to read back (with the path they were written on).
        self.stored_advantages: list[tuple[cst.CSTNode, str, Value]] = []
        # ``batch["returns"] = ...``: the advantages of a REINFORCE-style loss
        # when no advantages are stored.
        self.stored_returns: list[tuple[cst.CSTNode, str, Value]] = []
        # ``batch["token_level_rewards"] = scores - beta * kl``: per-token
        # rewards written for a loss elsewhere, which credits them.
        self.stored_rewards: list[tuple[cst.CSTNode, str, Value]] = []
        # Rewards a helper of this file stored into what it was given
        # (``data.batch["token_level_rewards"]``), shared by every frame of one root.
        self.helper_rewards: list[tuple[cst.CSTNode, str, Value]] = []
        self.loss_function = False
        self.function_node: cst.FunctionDef | None = None
        self.statement: cst.CSTNode | None = None
        self.root: cst.FunctionDef | None = None  # the function the nodes are placed in
        self.entry_root: cst.FunctionDef | None = None  # the function being analysed (depth 0)
        self.in_constant = False  # evaluating a module-level constant where it is read
        # Conditions just tested (by node id) on a flag whose settings give a
        # default, with the truth value that default gives them.
        self.flag_defaults: dict[int, bool] = {}
        # A property read run as a call (``kl_term.mse``): the call kllint
        # makes for it, by id, with the attribute a finding there points at.
        self.property_reads: dict[int, tuple[cst.Call, cst.BaseExpression]] = {}
        # Lookups of a key a dict written out in the code does not hold
        # (``KL_PENALTIES["k2"]``): a ``try`` that catches ``KeyError`` runs
        # its handler.
        self.missing_keys = 0

    def scope(self) -> Callable[[], dict[str, Value]]:
        """This function's locals as a closure defined here sees them: when
        it is called, not when it is defined (a branch replaces ``env``)."""
        return lambda: self.env

    # ----------------------------------------------------------------- origins

    def origin(self, node: cst.CSTNode) -> ir.Origin:
        if self.call_site is not None:
            return self.call_site
        return ir.Origin(
            self.context.path,
            cst_node=node,
            statement=self.statement,
            function=self.root,
            # A base class's method of another file, run for a subclass of
            # this one: what it computes itself is that file's finding.
            reported_by_helper=self.module is not self.context.module,
        )

    # ----------------------------------------------------------------- evidence

    def resolve(
        self, unknown: Unknown, target: str | None = None, *, keep_unknown: bool = False
    ) -> Value:
        """What an unknown value is (see ``roles.resolve``), here."""
        return roles.resolve(
            unknown,
            self.context.role_patterns,
            target,
            keep_unknown=keep_unknown,
            no_grad=self.no_grad,
        )

    def as_node(self, value: Value) -> ir.Node:
        """Any value as an IR node: numbers as constants, unknowns by their evidence."""
        if isinstance(value, ir.Node):
            return value
        if isinstance(value, Py):
            if isinstance(value.value, bool):
                return ir.Const(float(value.value))
            if isinstance(value.value, (int, float)):
                return ir.Const(float(value.value))
            return ir.Opaque(repr(value.value))
        if isinstance(value, Unknown):
            node = self.resolve(value)
            return node if isinstance(node, ir.Node) else ir.Opaque(value.text)
        if isinstance(value, Flipped):
            return ir.Opaque("flipped along time")
        if isinstance(value, Grouped):
            return value.node
        return ir.Opaque(type(value).__name__)

    # ----------------------------------------------------------------- arithmetic

    def binary(self, op: str, left: Value, right: Value, node: cst.CSTNode) -> Value:
        if op in ("add", "sub"):
            combined = vocabulary_sums_combined(op, left, right, self.origin(node))
            if combined is not None:
                return combined
        return binary(op, left, right, self.origin(node), self.as_node)

    def lift1(self, value: Value, fn: Callable[[ir.Node], ir.Node]) -> Value:
        return lift1(value, fn, self.as_node)

    def lift2(self, left: Value, right: Value, fn: Callable[[ir.Node, ir.Node], ir.Node]) -> Value:
        return lift2(left, right, fn, self.as_node)

    def torch_call(self, call: cst.CSTNode) -> TorchCall:
        return TorchCall(self.origin(call), call, self.as_node)

    # ----------------------------------------------------------------- provided by the layers above

    def eval(self, expr: cst.BaseExpression) -> Value:
        raise NotImplementedError

    def eval_call(self, call: cst.Call) -> Value:
        raise NotImplementedError

    def truth(self, expr: cst.BaseExpression) -> bool | None:
        raise NotImplementedError

    def assign(self, target: cst.BaseExpression, value: Value, node: cst.CSTNode) -> None:
        raise NotImplementedError

    def inline(
        self,
        ref: FuncRef,
        call: cst.Call,
        evaluated: Sequence[Value] | None = None,
        arguments: Sequence[cst.Arg] | None = None,
    ) -> Value:
        raise NotImplementedError

    def may_matter(
        self, ref: FuncRef, bound: dict[str, Value], given: Sequence[Value] = ()
    ) -> bool:
        raise NotImplementedError

    def bind_loop_target(
        self,
        target: cst.BaseAssignTargetExpression,
        iterable: cst.BaseExpression,
        node: cst.CSTNode,
    ) -> None:
        raise NotImplementedError

    def add_sink(
        self,
        value: Value,
        description: str,
        strong: bool,
        node: cst.CSTNode,
        *,
        backward: bool = False,
        read_elsewhere: bool = False,
    ) -> None:
        raise NotImplementedError
