"""Lowering code to the KL expression IR: an abstract interpreter over one
function's statements.

Each local name maps to an abstract value: an IR node (a tensor expression
over atoms), a Python literal (a selector such as ``"low_var_kl"``), a
``Choice`` between values when a branch cannot be decided, a sequence, a
function, or an ``Unknown`` that becomes an atom once evidence says what it
is. Following assignments is what makes ``ratio = (ref - logp).exp()`` and
``ratio - ratio.log() - 1`` one expression, and ``x = -x`` a new one.

Gradient flow is part of the values: ``.detach()``, ``.item()``, ``.data``,
``torch.no_grad()``/``inference_mode()`` blocks and decorators, and stored
rollout tensors wrap what they produce in ``detach``. Calls into helper
functions of the project are interpreted with their arguments bound, so a
string selector picks its branch at the call site and the verdict belongs to
that call site.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import libcst as cst

from kllint.analysis import ir, roles
from kllint.analysis.ir import Axis, Role
from kllint.analysis.lowering import (
    AGGREGATORS,
    BINARY_METHODS,
    DETACHING,
    IN_PLACE,
    LOGPROB_OPS,
    MUTATING,
    TENSOR_IDENTITY,
    UNARY,
    has_distribution,
    is_mask,
    to_token_level,
    vocabulary_expectation,
)
from kllint.analysis.module import ClassInfo, ModuleInfo, dotted_name
from kllint.analysis.project import Project
from kllint.analysis.values import (
    AND,
    HIDDEN,
    MAX_OPTIONS,
    Choice,
    DictVal,
    Flipped,
    FuncRef,
    Py,
    Seq,
    Unknown,
    Value,
    choice,
    join_conditions,
    merge_envs,
    negate_condition,
    same_value,
)


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


MAX_DEPTH = 4  # helpers inlined inside helpers, at most

# --------------------------------------------------------------------- context

_NO_GRAD = frozenset({"no_grad", "inference_mode"})
_LOSS_FUNCTIONS = frozenset(
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


def _names_a_loss_function(name: str) -> bool:
    """``gspo_loss_seq_k3``, ``loss_with_kl``: a function that computes a loss,
    not one that logs or scales one (``log_loss_stats``, ``loss_scale``)."""
    ws = roles.words(name)
    return ("loss" in ws or "losses" in ws) and not set(ws) & _NOT_A_LOSS_WORDS


_NOT_A_LOSS_WORDS = frozenset(
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


def is_loss_name(name: str) -> bool:
    """``loss``, ``kl_loss``, ``policy_loss``, ``losses``; not ``loss_mask``."""
    ws = roles.words(name)
    # Not "objective": objectives are maximised, so their KL sign is reversed.
    return bool(ws) and ws[-1] in ("loss", "losses")


@dataclass
class FileContext:
    path: str  # as displayed
    fs_path: Path
    module: ModuleInfo
    project: Project
    role_patterns: roles.RolePatterns
    sinks: list[Sink] = field(default_factory=list)
    called: frozenset[str] = frozenset()  # names of functions this file calls


# --------------------------------------------------------------------- interpreter


class Interpreter:
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
    ) -> None:
        self.context = context
        self.module = module
        self.cls = cls
        self.depth = depth
        self.call_site = call_site
        self.stack = stack
        self.function_name = function_name
        self.env: dict[str, Value] = {}
        self.no_grad = False
        self.path: list[str] = []
        self.returns: list[tuple[str, Value]] = []
        self.loss_function = False
        self.function_node: cst.FunctionDef | None = None
        self.statement: cst.CSTNode | None = None
        self.root: cst.FunctionDef | None = None  # the function being analysed (depth 0)

    # ----------------------------------------------------------------- origins

    def origin(self, node: cst.CSTNode) -> ir.Origin:
        if self.call_site is not None:
            return self.call_site
        return ir.Origin(self.context.path, cst_node=node, statement=self.statement)

    # ----------------------------------------------------------------- functions

    def run_function(
        self, fn: cst.FunctionDef, bound: dict[str, Value] | None = None, *, no_grad: bool = False
    ) -> Value | None:
        self.no_grad = no_grad or _decorated_no_grad(fn)
        self.function_name = fn.name.value
        self.function_node = fn
        if self.depth == 0:
            self.root = fn
        self.loss_function = self._is_loss_function(fn)
        params = fn.params
        for param in [*params.posonly_params, *params.params, *params.kwonly_params]:
            name = param.name.value
            if bound is not None and name in bound:
                self.env[name] = bound[name]
            elif param.default is not None and (
                bound is not None or _is_selector_literal(param.default)
            ):
                # A keyword default picks the branch when the caller (or, for a
                # function analysed on its own, every caller that omits it) does not.
                self.env[name] = self.eval(param.default)
            else:
                self.env[name] = self.param_value(name)
        for star in (params.star_arg, params.star_kwarg):
            if isinstance(star, cst.Param):
                self.env[star.name.value] = Unknown(star.name.value, (star.name.value,))
        self.exec_block(fn.body.body if isinstance(fn.body, cst.IndentedBlock) else [fn.body])
        if not self.returns:
            return None
        return choice(self.returns)

    def param_value(self, name: str) -> Value:
        unknown = Unknown(name, (name,))
        return self.resolve(unknown, name, keep_unknown=True)

    def _is_loss_function(self, fn: cst.FunctionDef) -> bool:
        name = fn.name.value
        if name in self.context.called and name not in _LOSS_FUNCTIONS:
            # A helper of this file: judged at its call sites, where the
            # arguments (and so the branch and the gradient path) are known.
            # Framework entry points (compute_loss, training_step) stay losses
            # even when the file also calls them, e.g. under no_grad to evaluate.
            return False
        if name in _LOSS_FUNCTIONS or is_loss_name(name) or _names_a_loss_function(name):
            return True
        return (
            name in ("forward", "__call__")
            and self.cls is not None
            and is_loss_name(self.cls.node.name.value)
        )

    # ----------------------------------------------------------------- statements

    def exec_block(self, statements: Sequence[cst.CSTNode]) -> bool:
        """Returns True when every path through the block returned."""
        for statement in statements:
            if self.exec_statement(statement):
                return True
        return False

    def exec_statement(self, statement: cst.CSTNode) -> bool:
        if isinstance(statement, cst.SimpleStatementLine):
            self.statement = statement
            for small in statement.body:
                if self.exec_small(small):
                    return True
            return False
        if isinstance(statement, cst.If):
            return self.exec_if(statement)
        if isinstance(statement, cst.Match):
            return self.exec_match(statement)
        if isinstance(statement, (cst.For, cst.While)):
            self.exec_loop(statement)
            return False
        if isinstance(statement, cst.With):
            saved = self.no_grad
            for item in statement.items:
                name = dotted_name(item.item.func) if isinstance(item.item, cst.Call) else None
                if (name is not None and name.split(".")[-1] in _NO_GRAD) or (
                    isinstance(item.item, cst.Call)
                    and isinstance(item.item.func, cst.Attribute)
                    and item.item.func.attr.value == "set_grad_enabled"
                ):
                    self.no_grad = True
                if item.asname is not None:
                    self.assign(item.asname.name, Unknown(_code(item.item), ("context",)), item)
            done = self.exec_block(statement.body.body)
            self.no_grad = saved
            return done
        if isinstance(statement, cst.Try):
            done = self.exec_block(statement.body.body)
            if statement.finalbody is not None:
                self.exec_block(statement.finalbody.body.body)
            return done and not statement.handlers
        if isinstance(statement, cst.FunctionDef):
            self.env[statement.name.value] = FuncRef(statement, self.module, self.cls)
            return False
        return False

    def exec_loop(self, statement: cst.For | cst.While) -> None:
        """A loop body runs once. A loop over time (``for t in
        reversed(range(T))``) that updates a variable from its own previous
        value (``lastgaelam = delta + gamma * lam * lastgaelam``, ``ret = r +
        gamma * ret``) is a scan: the variable becomes the cumulative sum of
        what is added at each step, reversed for a backward loop. That is how
        per-token KL rewards reach advantages through GAE and returns loops.
        Discounts are not modelled (they only scale later tokens' credit)."""
        direction = _time_loop_direction(statement)
        if isinstance(statement, cst.For):
            self.bind_loop_target(statement.target, statement.iter, statement)
        carried: dict[str, ir.Node] = {}
        if direction is not None:
            for name in _assigned_names(statement.body):
                if isinstance(self.env.get(name), ir.Node):
                    carried[name] = ir.Opaque(f"{name} at the next step")
                    self.env[name] = carried[name]
        before = {name: self.env[name] for name in carried}
        self.exec_block(statement.body.body)
        if statement.orelse is not None:
            self.exec_block(statement.orelse.body.body)
        if not carried:
            return
        scans: dict[int, ir.Node] = {}
        reverse = direction == "reverse"

        def scanned(step: Value, placeholder: ir.Node) -> Value | None:
            """The scan of a recurrence, per alternative when a branch in the
            body (``next_value = values[:, t + 1] if ... else 0``) split it."""
            if isinstance(step, Choice):
                options = [(label, scanned(v, placeholder)) for label, v in step.options]
                if all(v is None for _, v in options):
                    return None
                return choice(
                    [
                        (label, v if v is not None else original)
                        for (label, v), (_, original) in zip(options, step.options)
                    ]
                )
            if isinstance(step, ir.Node) and ir.contains(step, placeholder):
                added = ir.substitute(step, {id(placeholder): ir.Const(0.0)})
                scan = ir.CumSum(
                    added,
                    reverse=reverse,
                    discount=_discount_of(step, placeholder),
                    origin=step.origin,
                )
                scans.setdefault(id(placeholder), scan)
                scans[id(step)] = scan  # what was appended each step is the scan itself
                return scan
            return None

        def substituted(value: Value) -> Value:
            if isinstance(value, ir.Node):
                return ir.substitute(value, scans)
            if isinstance(value, Choice):
                return Choice([(label, substituted(v)) for label, v in value.options])
            return value

        for name, placeholder in carried.items():
            step = self.env.get(name)
            result = scanned(step, placeholder) if step is not None else None
            if result is not None:
                self.env[name] = result
            elif step is before[name]:
                self.env[name] = ir.Opaque(f"{name} after the loop")
        if scans:
            for name, value in list(self.env.items()):
                if isinstance(value, Seq) and value.appended:
                    value.items = [substituted(i) for i in value.items]
                elif isinstance(value, (ir.Node, Choice)):
                    self.env[name] = substituted(value)

    def bind_loop_target(
        self,
        target: cst.BaseAssignTargetExpression,
        iterable: cst.BaseExpression,
        node: cst.CSTNode,
    ) -> None:
        """``for logp, ref in zip(logprobs, ref_logprobs)``: each row of a
        tensor is what the tensor is, so the loop variables are bound to it."""
        if isinstance(iterable, cst.Call) and isinstance(iterable.func, cst.Name):
            function = iterable.func.value
            args = [a.value for a in iterable.args]
            if (
                function == "zip"
                and isinstance(target, (cst.Tuple, cst.List))
                and len(target.elements) == len(args)
            ):
                for element, arg in zip(target.elements, args):
                    self.bind_loop_target(element.value, arg, node)  # type: ignore[arg-type]
                return
            if (
                function == "enumerate"
                and isinstance(target, (cst.Tuple, cst.List))
                and len(target.elements) == 2
                and args
            ):
                self.assign(target.elements[0].value, Unknown("index", ("index",)), node)
                self.bind_loop_target(target.elements[1].value, args[0], node)  # type: ignore[arg-type]
                return
        value = self.eval(iterable)
        if isinstance(value, (ir.Node, Choice)) and not isinstance(value, ir.Opaque):
            self.assign(target, value, node)
        elif isinstance(value, Seq) and value.items and isinstance(target, cst.Name):
            self.assign(target, value.items[0], node)
        else:
            self.assign(target, Unknown(_code(iterable), ("loop",)), node)

    def exec_if(self, statement: cst.If) -> bool:
        orelse = statement.orelse
        else_body: Sequence[cst.CSTNode] = []
        if isinstance(orelse, cst.Else):
            else_body = orelse.body.body
        elif isinstance(orelse, cst.If):
            else_body = [orelse]
        return self.exec_branch(
            self.truth(statement.test),
            lambda: self.condition_label(statement.test),
            lambda: self.exec_block(statement.body.body),
            lambda: self.exec_block(else_body),
        )

    def exec_branch(
        self,
        truth: bool | None,
        label: Callable[[], str],
        then_run: Callable[[], bool],
        else_run: Callable[[], bool],
    ) -> bool:
        """Run the branch a known condition takes, or both with the condition
        recorded on each path and the environments merged after."""
        if truth is True:
            return then_run()
        if truth is False:
            return else_run()
        condition = label()
        saved_env, saved_path = dict(self.env), list(self.path)
        self.path = [*saved_path, condition]
        then_done = then_run()
        then_env = self.env
        self.env, self.path = dict(saved_env), [*saved_path, negate_condition(condition)]
        else_done = else_run()
        else_env = self.env
        self.path = saved_path
        if then_done and else_done:
            return True
        if then_done:
            self.env = else_env
        elif else_done:
            self.env = then_env
        else:
            self.env = merge_envs(then_env, else_env, condition)
        return False

    def exec_match(self, statement: cst.Match) -> bool:
        """``match kind: case "k3": ...`` is an if/elif chain on ``kind``."""
        subject = self.eval(statement.subject)
        subject_text = _full_code(statement.subject)
        cases = list(statement.cases)

        def run(index: int) -> bool:
            if index >= len(cases):
                return False
            case = cases[index]
            truth = self.pattern_truth(subject, case.pattern)
            if case.guard is not None and truth is not False:
                guard = self.truth(case.guard)
                truth = False if guard is False else (truth if guard is True else None)
            text = f"{subject_text} == {_full_code(case.pattern)}"
            selects = self.selects_estimator(statement.subject, case.pattern, text)
            return self.exec_branch(
                truth,
                lambda: text if selects else HIDDEN + text,
                lambda: self.exec_block(case.body.body),
                lambda: run(index + 1),
            )

        return run(0)

    def pattern_truth(self, subject: Value, pattern: cst.MatchPattern) -> bool | None:
        if isinstance(pattern, (cst.MatchValue, cst.MatchSingleton)):
            return _compare(cst.Equal(), subject, self.eval(pattern.value))
        if isinstance(pattern, cst.MatchAs) and pattern.pattern is None:
            if pattern.name is not None:
                self.env[pattern.name.value] = subject
            return True  # ``case _:`` or a capture
        if isinstance(pattern, cst.MatchOr):
            outcomes = [
                self.pattern_truth(subject, element.pattern) for element in pattern.patterns
            ]
            if any(o is True for o in outcomes):
                return True
            return False if all(o is False for o in outcomes) else None
        return None

    def condition_label(self, test: cst.BaseExpression) -> str:
        """A branch condition, shown in messages only when it can select an
        estimator: it mentions the KL, or compares a selector (``kind``,
        ``estimator``, any string test inside a helper) with a string. A
        ``loss_type == "cispo"`` in the trainer around it is not shown."""
        text = _full_code(test)
        return text if self.selects_estimator(test, test, text) else HIDDEN + text

    def selects_estimator(self, subject: cst.CSTNode, compared: cst.CSTNode, text: str) -> bool:
        lowered = text.lower()
        if any(word in lowered for word in ("kl", "estimator", "penalty", "divergence")):
            return True
        if not any(isinstance(n, cst.SimpleString) for n in _descendants(compared)):
            return False
        if self.depth > 0:
            return True
        names = {
            w
            for n in _descendants(subject)
            if isinstance(n, cst.Name)
            for w in roles.words(n.value)
        }
        return bool(names & _SELECTOR_WORDS)

    def exec_small(self, small: cst.BaseSmallStatement) -> bool:
        if isinstance(small, cst.Assign):
            value = self.eval(small.value)
            for target in small.targets:
                self.assign(target.target, value, small)
        elif isinstance(small, cst.AnnAssign) and small.value is not None:
            self.assign(small.target, self.eval(small.value), small)
        elif isinstance(small, cst.AugAssign):
            op = _BINOPS.get(type(small.operator).__name__.replace("Assign", ""))
            current = self.eval(small.target)
            value = self.eval(small.value)
            combined = (
                self.binary(op, current, value, small)
                if op
                else Unknown(_code(small), ("augassign",))
            )
            if (
                isinstance(small.target, cst.Subscript)
                and isinstance(small.target.value, cst.Name)
                and op in ("add", "sub")
            ):
                # ``rewards[:, -1] += scores`` adds to part of the tensor: what was
                # there stays, and the new part is a separate additive term.
                self.env[small.target.value.value] = combined
            else:
                self.assign(small.target, combined, small)
        elif isinstance(small, cst.Expr):
            self.eval(small.value)
        elif isinstance(small, cst.Return):
            value = self.eval(small.value) if small.value is not None else Py(None)
            if self.no_grad and isinstance(value, (ir.Node, Choice, Flipped)):
                value = self.lift1(value, ir.detach, small)
            self.returns.append((AND.join(self.path), value))
            if self.loss_function and self.depth == 0:
                self.loss_sink_from_return(small, value)
            return True
        elif isinstance(small, cst.Raise):
            return True
        return False

    def loss_sink_from_return(self, node: cst.Return, value: Value) -> None:
        description = f"the value returned by `{self.function_name}`"
        if isinstance(value, DictVal):
            for key, item in value.items.items():
                if is_loss_name(key):
                    self.add_sink(item, f"{description} as `{key}`", True, node)
            return
        if isinstance(value, Seq) and value.items and isinstance(node.value, (cst.Tuple, cst.List)):
            # ``return loss, metrics``: the elements named like a loss, else the first.
            elements = [e.value for e in node.value.elements]
            named = [
                v
                for e, v in zip(elements, value.items)
                if isinstance(e, cst.Name) and is_loss_name(e.value)
            ]
            for item in named or value.items[:1]:
                self.add_sink(item, description, True, node)
            return
        self.add_sink(value, description, True, node)

    def add_sink(
        self,
        value: Value,
        description: str,
        strong: bool,
        node: cst.CSTNode,
        *,
        backward: bool = False,
    ) -> None:
        if self.depth == 0:
            self.context.sinks.append(
                Sink(
                    value,
                    description,
                    strong,
                    node,
                    self.function_name,
                    self.function_node,
                    backward,
                )
            )
        elif backward and self.call_site is not None:
            # ``self.train_minibatch(batch)`` from the training loop: the
            # backward pass inside the helper sees the caller's values (KL
            # rewards computed in another method), so it is a sink too, placed
            # at the call.
            self.context.sinks.append(
                Sink(
                    value,
                    f"{description} in {self.call_site.helper}",
                    strong,
                    self.call_site.cst_node,  # type: ignore[arg-type]
                    self.function_name,
                    self.root,
                    backward,
                    inlined_call=self.call_site.cst_node,  # type: ignore[arg-type]
                )
            )

    def assign(self, target: cst.BaseExpression, value: Value, node: cst.CSTNode) -> None:
        if self.no_grad and isinstance(value, (ir.Node, Choice, Flipped)):
            # Whatever is computed under no_grad/inference_mode has no gradient,
            # including arithmetic on tensors that had one.
            value = self.lift1(value, ir.detach, node)
        if isinstance(target, cst.Name):
            name = target.value
            patterns = self.context.role_patterns
            if not isinstance(value, Unknown) and (
                patterns.logprob_role(name) is not None
                or (patterns.role_from_words(name) is not None and _is_one_log_prob(value))
            ):
                value = self.name_logprob(name, value)
            if isinstance(value, Unknown):
                # The variable's own name is evidence too (``mask``, ``beta``).
                value = replace(value, names=(*value.names, name))
                value = self.resolve(value, name, keep_unknown=True)
            elif isinstance(value, Choice):
                value = Choice(
                    [
                        (
                            label,
                            self.resolve(v, name, keep_unknown=True)
                            if isinstance(v, Unknown)
                            else v,
                        )
                        for label, v in value.options
                    ]
                )
            self.env[name] = value
            if is_loss_name(name):
                self.add_sink(value, f"the loss variable `{name}`", False, node)
        elif isinstance(target, (cst.Tuple, cst.List)):
            elements = [e.value for e in target.elements]
            for i, element in enumerate(elements):
                if isinstance(value, Seq) and i < len(value.items):
                    item: Value = value.items[i]
                elif isinstance(value, ir.Node) and not isinstance(value, ir.Opaque):
                    # ``advantages, returns = compute_gae(rewards, ...)``: both carry the rewards.
                    item = value
                elif isinstance(value, Unknown):
                    item = Unknown(
                        f"{value.text}[{i}]",
                        value.names,
                        value.call,
                        value.stored,
                        value.reference_model,
                        value.logprob_op,
                        value.detached,
                    )
                else:
                    item = Unknown(_code(element), ("unpacked",))
                self.assign(element, item, node)
        elif isinstance(target, cst.Subscript) and isinstance(target.value, cst.Name):
            container = self.env.get(target.value.value)
            key = _string_key(target)
            if isinstance(container, (ir.Node, Seq)):
                # ``buffer[:, i] = ...`` fills a tensor in place: it is no longer what it was.
                self.env[target.value.value] = Unknown(target.value.value, (target.value.value,))
            if isinstance(container, DictVal) and key is not None:
                container.items[key] = value
                if is_loss_name(key):
                    self.add_sink(value, f"the loss entry `{key}`", False, node)

    def find_method(self, name: str) -> FuncRef | None:
        """``self.name``: in this class, else in its base classes (this module's
        or imported from the project), nearest first."""
        seen: set[int] = set()
        queue: list[tuple[ClassInfo, ModuleInfo]] = [(self.cls, self.module)] if self.cls else []
        while queue:
            cls, module = queue.pop(0)
            if id(cls.node) in seen:
                continue
            seen.add(id(cls.node))
            if name in cls.methods:
                return FuncRef(cls.methods[name], module, cls, bound=True)
            for base in cls.bases:
                found = self._class_named(base, module)
                if found is not None:
                    queue.append(found)
        return None

    def _class_named(self, dotted: str, module: ModuleInfo) -> tuple[ClassInfo, ModuleInfo] | None:
        head = dotted.split(".")[-1]
        if head in module.classes:
            return module.classes[head], module
        imported = module.imports.get(head)
        if imported is not None and imported.name is not None:
            target = self.context.project.resolve_module(
                imported.module, module.path, imported.level
            )
            if target is not None and imported.name in target.classes:
                return target.classes[imported.name], target
        return None

    # ----------------------------------------------------------------- evidence

    def name_logprob(self, name: str, value: Value) -> Value:
        """A value assigned to a name like ``ref_log_prob``: what a helper did to
        compute a log-prob (a model forward, a gather) does not matter, only
        which policy it belongs to and whether it carries gradient. A value
        that already involves the reference is a log-ratio and is kept."""
        nodes = [v for _, v in value.options] if isinstance(value, Choice) else [value]
        for n in nodes:
            if not isinstance(n, ir.Node):
                continue
            atoms = {
                (a.role, a.name)
                for a in n.atoms()
                if a.role in (Role.POLICY_LOGP, Role.OLD_LOGP, Role.REFERENCE_LOGP)
            }
            if len(atoms) >= 2 or n.has_role(Role.REFERENCE_LOGP) or has_distribution(n):
                return value  # a log-ratio (``logprobs_diff = new - old``), not a log-prob
        logprob_nodes = [
            n
            for n in nodes
            if isinstance(n, ir.Node)
            and any(n.has_role(r) for r in (Role.POLICY_LOGP, Role.OLD_LOGP))
        ]
        detached = bool(logprob_nodes) and not any(ir.depends_on_policy(n) for n in logprob_nodes)
        patterns = self.context.role_patterns
        if patterns.logprob_role(name) is None and logprob_nodes:
            # ``ref = reference_logprobs(...)``: a log-prob named by its role alone.
            role = patterns.role_from_words(name) or Role.POLICY_LOGP
            atom: ir.Node = ir.Atom(role, name, roles.level_of(name))
            return ir.detach(atom) if detached or self.no_grad else atom
        return self.resolve(Unknown(name, (name,), call=True, detached=detached))

    def resolve(
        self, unknown: Unknown, target: str | None = None, *, keep_unknown: bool = False
    ) -> Value:
        """Decide what an unknown value is, from the strongest evidence first."""
        patterns = self.context.role_patterns
        if unknown.numpy:
            return ir.Opaque(unknown.text)
        role: Role | None = None
        name = target or unknown.text
        prob = False
        if target is not None and (
            roles.is_logprob_name(target)
            or roles.is_prob_name(target)
            or patterns.logprob_role(target)
        ):
            role = patterns.logprob_role(target)
            prob = roles.is_prob_name(target) and not roles.is_logprob_name(target)
            if (
                role is Role.POLICY_LOGP
                and patterns.role_from_words(target) is None
                and unknown.reference_model
            ):
                role = Role.REFERENCE_LOGP
        if role is None:
            for hint in reversed(unknown.names):
                hint_role = patterns.logprob_role(hint)
                if hint_role is not None:
                    role = hint_role
                    name = hint if target is None else target
                    prob = roles.is_prob_name(hint) and not roles.is_logprob_name(hint)
                    if role is Role.POLICY_LOGP and unknown.reference_model:
                        role = Role.REFERENCE_LOGP
                    break
            else:
                if unknown.logprob_op and target is not None:
                    role = (
                        Role.REFERENCE_LOGP
                        if unknown.reference_model
                        else patterns.role_from_words(target) or Role.POLICY_LOGP
                    )
        if role is None:
            if keep_unknown:
                return unknown
            weight = roles.weight_role(unknown.names[-1] if unknown.names else unknown.text)
            if (
                weight is Role.ADVANTAGE
                and unknown.call
                and not (unknown.stored or unknown.detached or self.no_grad)
            ):
                # ``values = self.value_head(hidden)``: a prediction with its own
                # gradient (a critic), not a detached weight.
                return ir.Opaque(unknown.text)
            if weight is not None:
                return ir.Atom(weight, unknown.text)
            return ir.Opaque(unknown.text)
        level = ir.Level.DISTRIBUTION if unknown.distribution else roles.level_of(name)
        atom: ir.Node = ir.Atom(role, name, level)
        if prob:
            atom = ir.Unary("exp", atom)
        if unknown.stored or unknown.detached or self.no_grad:
            atom = ir.detach(atom)
        return atom

    def as_node(self, value: Value, origin_node: cst.CSTNode) -> ir.Node:
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
        return ir.Opaque(type(value).__name__)

    # ----------------------------------------------------------------- expressions

    def eval(self, expr: cst.BaseExpression) -> Value:
        try:
            return self._eval(expr)
        except RecursionError:
            return Unknown(_code(expr), ("deep",))

    def _eval(self, expr: cst.BaseExpression) -> Value:
        if isinstance(expr, cst.Name):
            return self.lookup(expr.value)
        if isinstance(expr, cst.Integer):
            return ir.Const(float(int(expr.value.replace("_", ""), 0)), origin=self.origin(expr))
        if isinstance(expr, cst.Float):
            return ir.Const(float(expr.value.replace("_", "")), origin=self.origin(expr))
        if isinstance(expr, (cst.SimpleString, cst.ConcatenatedString)):
            text = expr.evaluated_value
            return Py(text if isinstance(text, str) else None)
        if isinstance(expr, cst.FormattedString):
            return Py(None)
        if isinstance(expr, cst.UnaryOperation):
            operand = self.eval(expr.expression)
            if isinstance(expr.operator, cst.Minus):
                return self.lift1(operand, lambda n: ir.neg(n, self.origin(expr)), expr)
            if isinstance(expr.operator, cst.Plus):
                return operand
            if isinstance(expr.operator, cst.Not):
                truth = self.truth(expr.expression)
                return Py(not truth) if truth is not None else Unknown(_code(expr), ("not",))
            return Unknown(_code(expr), ("unary",))
        if isinstance(expr, cst.BinaryOperation):
            op = _BINOPS.get(type(expr.operator).__name__)
            left, right = self.eval(expr.left), self.eval(expr.right)
            if op is None:
                return Unknown(_code(expr), ("binop",))
            return self.binary(op, left, right, expr)
        if isinstance(expr, (cst.Comparison, cst.BooleanOperation)):
            truth = self.truth(expr)
            return Py(truth) if truth is not None else Unknown(_code(expr), ("condition",))
        if isinstance(expr, cst.IfExp):
            truth = self.truth(expr.test)
            if truth is True:
                return self.eval(expr.body)
            if truth is False:
                return self.eval(expr.orelse)
            label = self.condition_label(expr.test)
            return choice(
                [(label, self.eval(expr.body)), (negate_condition(label), self.eval(expr.orelse))]
            )
        if isinstance(expr, (cst.Tuple, cst.List)):
            if isinstance(expr, cst.List) and not expr.elements:
                return Seq([], appended=True)  # a list to be filled by ``.append``
            return Seq([self.eval(e.value) for e in expr.elements if isinstance(e, cst.Element)])
        if isinstance(expr, cst.Dict):
            items: dict[str, Value] = {}
            for element in expr.elements:
                if isinstance(element, cst.DictElement):
                    key = self.eval(element.key)
                    if isinstance(key, Py) and isinstance(key.value, str):
                        items[key.value] = self.eval(element.value)
            return DictVal(items)
        if isinstance(expr, cst.Attribute):
            return self.eval_attribute(expr)
        if isinstance(expr, cst.Subscript):
            return self.eval_subscript(expr)
        if isinstance(expr, cst.Call):
            return self.eval_call(expr)
        if isinstance(expr, cst.Await):
            return self.eval(expr.expression)
        if isinstance(expr, cst.Lambda):
            return FuncRef(_lambda_as_function(expr), self.module)
        if isinstance(expr, cst.DictComp):
            return self.eval_dict_comprehension(expr)
        return Unknown(_code(expr), (type(expr).__name__,))

    def eval_dict_comprehension(self, expr: cst.DictComp) -> Value:
        """``{k: v[idx] for k, v in batch.items()}`` over a known dict (a
        minibatch cut from a rollout): the same entries, each transformed."""
        loop = expr.for_in
        source = loop.iter
        if (
            loop.inner_for_in is None
            and not loop.ifs
            and isinstance(source, cst.Call)
            and isinstance(source.func, cst.Attribute)
            and source.func.attr.value == "items"
            and isinstance(loop.target, cst.Tuple)
            and len(loop.target.elements) == 2
            and all(isinstance(e.value, cst.Name) for e in loop.target.elements)
        ):
            table = self.eval(source.func.value)
            if isinstance(table, DictVal):
                key_name = loop.target.elements[0].value.value  # type: ignore[attr-defined]
                value_name = loop.target.elements[1].value.value  # type: ignore[attr-defined]
                saved = {n: self.env.get(n) for n in (key_name, value_name)}
                items: dict[str, Value] = {}
                for key, item in table.items.items():
                    self.env[key_name], self.env[value_name] = Py(key), item
                    items[key] = self.eval(expr.value)
                for n, v in saved.items():
                    if v is None:
                        self.env.pop(n, None)
                    else:
                        self.env[n] = v
                return DictVal(items)
        return Unknown(_code(expr), ("comprehension",))

    def lookup(self, name: str) -> Value:
        if name in self.env:
            return self.env[name]
        if name in ("True", "False", "None"):
            return Py({"True": True, "False": False, "None": None}[name])
        if name in self.module.functions:
            return FuncRef(self.module.functions[name], self.module)
        if name in self.module.classes:
            return Unknown(name, (name,), module=None, class_name=name)
        if name in self.module.imports:
            imported = self.module.imports[name]
            # Leading dots keep a relative import relative: ``from ..core import f``
            # is "..core.f", resolved from this module's package.
            dotted = ".".join(p for p in (imported.module, imported.name) if p)
            full = "." * imported.level + dotted
            return Unknown(name, (name,), module=full)
        if name in self.module.constants:
            constant = self.module.constants[name]
            if isinstance(constant, (cst.Dict, cst.Lambda)):
                return self.eval(constant)  # a dispatch table: {"k3": low_var_kl, ...}
            if isinstance(constant, cst.Call) and (dotted_name(constant.func) or "").endswith(
                "partial"
            ):
                return self.eval(constant)  # mse_kl = functools.partial(kl_penalty, kind="mse")
            if isinstance(constant, (cst.SimpleString, cst.Integer, cst.Float, cst.Name)):
                return (
                    self.eval(constant)
                    if not isinstance(constant, cst.Name)
                    else Unknown(name, (name,))
                )
        return Unknown(name, (name,))

    def eval_attribute(self, expr: cst.Attribute) -> Value:
        base = self.eval(expr.value)
        attr = expr.attr.value
        if isinstance(base, (ir.Node, Choice)) and not isinstance(base, ir.Opaque):
            if attr == "data":
                return self.lift1(base, lambda n: ir.detach(n, self.origin(expr)), expr)
            if attr in ("T", "mT", "real"):
                return base
            if attr == "shape":
                # Sizes are positive constants: a normaliser, not a gradient path.
                return ir.Atom(Role.COEFFICIENT, _code(expr))
            return Unknown(_code(expr), (attr,))
        if isinstance(base, Unknown) and base.class_name is not None:
            member = _class_constant(self.module, base.class_name, attr)
            if member is not None:
                return member  # ``KLEstimator.K3``: an Enum member stands for its value
        if isinstance(base, Py) and attr in ("value", "name"):
            return base if attr == "value" else Py(None)
        if isinstance(base, Unknown) and attr == "shape" and base.module is None:
            return ir.Atom(Role.COEFFICIENT, _code(expr))
        if isinstance(base, Unknown):
            unknown = replace(
                base,
                text=_code(expr),
                names=(*base.names, attr),
                stored=base.stored or (not base.call and _is_container_chain(base.names)),
                detached=base.detached or attr == "data",
                module=f"{base.module}.{attr}" if base.module else None,
                distribution=False,
                class_name=None,
            )
            default = self.config_default(base, attr)
            return default if default is not None else unknown
        if isinstance(base, (FuncRef, Py)):
            return Unknown(_code(expr), (attr,))
        return Unknown(_code(expr), (attr,))

    def config_default(self, base: Unknown, attr: str) -> Py | None:
        """``self.config.kl_loss_type`` and the like: the one default the
        project gives that setting, if there is exactly one."""
        if base.call or base.module is not None:
            return None
        typed = self.typed_default(base, attr)
        if typed is not None:
            return typed
        if not any(w in _CONFIG_WORDS for n in base.names for w in roles.words(n)):
            return None
        defaults = self.context.project.config_defaults(self.context.fs_path, attr)
        # ``args.x`` is an argparse namespace; ``config.x`` a config class or YAML.
        from_args = any("args" in roles.words(n) for n in base.names)
        preferred = [d for d in defaults if (d.kind == "argparse") == from_args]
        defaults = preferred or defaults
        if not all(isinstance(d.value, str) for d in defaults):
            # Feature flags and numbers stay open: a default of ``use_kl_loss:
            # false`` must not hide the code path users turn on.
            return None
        values = {repr(d.value) for d in defaults}
        if len(values) != 1:
            return None
        sources = sorted({d.source for d in defaults})
        return Py(
            defaults[0].value, source="; ".join(sources[:2]) + (" ..." if len(sources) > 2 else "")
        )

    def typed_default(self, base: Unknown, attr: str) -> Py | None:
        """``config.x`` where ``config: TrainerConfig`` is a parameter (or
        ``self.args.x`` where ``__init__`` takes ``args: TrainerConfig``): the
        default that class gives ``x``, the most specific evidence there is."""
        annotation: cst.BaseExpression | None = None
        if len(base.names) == 1 and self.function_node is not None:
            annotation = _annotation_of(self.function_node, base.names[0])
        elif len(base.names) == 2 and base.names[0] == "self" and self.cls is not None:
            init = self.cls.methods.get("__init__")
            if init is not None:
                annotation = _annotation_of(init, base.names[1])
        class_name = dotted_name(annotation) if annotation is not None else None
        if class_name is None:
            return None
        found = self._class_named(class_name, self.module)
        if found is None:
            return None
        cls, module = found
        for statement in cls.node.body.body:
            if not isinstance(statement, cst.SimpleStatementLine):
                continue
            for small in statement.body:
                if not (isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name)):
                    continue
                if small.target.value != attr or small.value is None:
                    continue
                value: cst.BaseExpression | None = small.value
                if isinstance(value, cst.Call) and dotted_name(value.func) in (
                    "field",
                    "dataclasses.field",
                ):
                    value = next(
                        (a.value for a in value.args if a.keyword and a.keyword.value == "default"),
                        None,
                    )
                if isinstance(value, cst.SimpleString) and isinstance(value.evaluated_value, str):
                    line = module.line_of_class(cls.node.name.value)
                    return Py(
                        value.evaluated_value,
                        source=f"`{cls.node.name.value}` ({module.path.name}:{line})",
                    )
        return None

    def eval_subscript(self, expr: cst.Subscript) -> Value:
        base = self.eval(expr.value)
        key_value: Value | None = None
        if len(expr.slice) == 1 and isinstance(expr.slice[0].slice, cst.Index):
            key_value = self.eval(expr.slice[0].slice.value)
        if (
            isinstance(base, DictVal)
            and isinstance(key_value, Py)
            and isinstance(key_value.value, str)
        ):
            return base.items.get(key_value.value, Unknown(_code(expr), (key_value.value,)))
        if (
            isinstance(base, DictVal)
            and base.items
            and key_value is not None
            and not isinstance(key_value, Py)
        ):
            # A dispatch table indexed by a selector kllint cannot resolve.
            label = _full_code(expr.slice[0].slice)
            return choice([(f"{label} == {key!r}", item) for key, item in base.items.items()])
        if isinstance(base, Seq):
            if isinstance(key_value, ir.Const) and float(key_value.value).is_integer():
                index = int(key_value.value)
                if -len(base.items) <= index < len(base.items):
                    return base.items[index]
            if (
                isinstance(key_value, Py)
                and isinstance(key_value.value, int)
                and not isinstance(key_value.value, bool)
            ):
                index = key_value.value
                if -len(base.items) <= index < len(base.items):
                    return base.items[index]
            if base.appended:
                return base  # ``steps[::-1]``: the same rows, reordered
            if key_value is not None:
                label = _full_code(expr.slice[0].slice)
                return choice([(f"{label} == {i}", item) for i, item in enumerate(base.items)])
            return Unknown(_code(expr), ("slice",))
        if isinstance(base, Unknown):
            key = (
                key_value.value
                if isinstance(key_value, Py) and isinstance(key_value.value, str)
                else None
            )
            # Slicing keeps what a tensor is; a string key names what it holds.
            return replace(
                base,
                text=_code(expr),
                names=(*base.names, key) if key else base.names,
                stored=base.stored or (not base.call and _is_container_chain(base.names)),
                module=None,
                class_name=None,
            )
        if isinstance(base, (ir.Node, Choice, Flipped)):
            return base  # slicing a tensor keeps what it is
        return Unknown(_code(expr), ("subscript",))

    # ----------------------------------------------------------------- conditions

    def truth(self, expr: cst.BaseExpression) -> bool | None:
        if isinstance(expr, cst.BooleanOperation):
            first, second = self.truth(expr.left), self.truth(expr.right)
            if isinstance(expr.operator, cst.And):
                if first is False or second is False:
                    return False
                return True if first is True and second is True else None
            if first is True or second is True:
                return True
            return False if first is False and second is False else None
        if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Not):
            inner = self.truth(expr.expression)
            return None if inner is None else not inner
        if isinstance(expr, cst.Comparison):
            left = self.eval(expr.left)
            result: bool | None = True
            for target in expr.comparisons:
                right = self.eval(target.comparator)
                outcome = _compare(target.operator, left, right)
                if outcome is None:
                    return None
                for side in (left, right):
                    if isinstance(side, Py) and side.source and self.call_site is not None:
                        note = f"{_full_code(expr.left)} = {side.value!r} (the default in {side.source})"
                        if note not in self.call_site.notes:
                            self.call_site.notes.append(note)
                result = result and outcome
                left = right
            return result
        value = self.eval(expr)
        if isinstance(value, Py):
            return bool(value.value)
        if isinstance(value, ir.Const):
            return bool(value.value)
        return None

    # ----------------------------------------------------------------- arithmetic

    def binary(self, op: str, left: Value, right: Value, node: cst.CSTNode) -> Value:
        if isinstance(left, Py) and isinstance(right, Py) and op == "add":
            if isinstance(left.value, str) and isinstance(right.value, str):
                return Py(left.value + right.value)
        return self.lift2(left, right, lambda a, b: ir.binary(op, a, b, self.origin(node)), node)

    def lift1(self, value: Value, fn: Callable[[ir.Node], ir.Node], node: cst.CSTNode) -> Value:
        if isinstance(value, Choice):
            return choice([(label, self.lift1(v, fn, node)) for label, v in value.options])
        if isinstance(value, Flipped):
            return Flipped(fn(value.node))  # elementwise ops commute with a flip
        return fn(self.as_node(value, node))

    def lift2(
        self,
        left: Value,
        right: Value,
        fn: Callable[[ir.Node, ir.Node], ir.Node],
        node: cst.CSTNode,
    ) -> Value:
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
            return choice([(label, self.lift2(a, b, fn, node)) for label, a, b in combos])
        if isinstance(left, Flipped) and isinstance(right, Flipped):
            return Flipped(fn(left.node, right.node))
        if isinstance(left, Flipped) or isinstance(right, Flipped):
            other = right if isinstance(left, Flipped) else left
            other_node = self.as_node(other, node)
            if not any(
                a.role in (Role.POLICY_LOGP, Role.REFERENCE_LOGP, Role.OLD_LOGP, Role.ADVANTAGE)
                for a in other_node.atoms()
            ):
                # A mask or a coefficient broadcast over time commutes with the flip.
                if isinstance(left, Flipped):
                    return Flipped(fn(left.node, other_node))
                assert isinstance(right, Flipped)
                return Flipped(fn(other_node, right.node))
            return ir.Opaque("flipped tensor mixed with an unflipped one")
        return fn(self.as_node(left, node), self.as_node(right, node))

    # ----------------------------------------------------------------- calls

    def eval_call(self, call: cst.Call) -> Value:
        func = call.func
        args = [a for a in call.args if a.keyword is None and a.star == ""]
        kwargs = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
        if isinstance(func, cst.Attribute):
            method = func.attr.value
            if method in ("backward", "manual_backward"):
                target = args[0].value if args else func.value
                value = self.eval(target)
                self.add_sink(
                    value,
                    f"`{_full_code(call)}`" if len(_full_code(call)) < 60 else f"`.{method}()`",
                    True,
                    call,
                    backward=True,
                )
                return Py(None)
            receiver = self.eval(func.value)
            if isinstance(receiver, DictVal) and method == "values" and not args:
                return Seq(list(receiver.items.values()))
            if (
                method == "append"
                and isinstance(func.value, cst.Name)
                and isinstance(self.env.get(func.value.value), Seq)
                and args
            ):
                listed = self.env[func.value.value]
                assert isinstance(listed, Seq)
                self.env[func.value.value] = Seq(
                    [*listed.items, self.eval(args[0].value)], appended=True
                )
                return Py(None)
            if (
                method in IN_PLACE
                and isinstance(func.value, cst.Name)
                and isinstance(self.env.get(func.value.value), (ir.Node, Choice))
            ):
                # ``kl.mul_(mask)``: the tensor becomes what the operation gives.
                name = func.value.value
                self.env[name] = self.method_op(
                    IN_PLACE[method], self.env[name], args, kwargs, call
                )
                return Py(None)
            if (
                method in MUTATING
                and isinstance(func.value, cst.Name)
                and func.value.value in self.env
            ):
                name = func.value.value
                self.env[name] = Unknown(name, (name,))
                return Py(None)
            if isinstance(receiver, Unknown) and receiver.module is not None:
                return self.call_module_function(receiver.module, method, call, args, kwargs)
            if method == "scale" and isinstance(receiver, Unknown) and len(args) == 1:
                # ``scaler.scale(loss).backward()`` (AMP): the scaled loss is the loss.
                scaled = self.eval(args[0].value)
                if isinstance(scaled, (ir.Node, Choice)):
                    return scaled
            if isinstance(receiver, (ir.Node, Choice, Flipped)) and not isinstance(
                receiver, ir.Opaque
            ):
                return self.method_op(method, receiver, args, kwargs, call)
            if (
                isinstance(receiver, Unknown)
                and receiver.names
                and receiver.names[0] == "self"
                and len(receiver.names) == 1
            ):
                found = self.find_method(method)
                if found is not None:
                    return self.inline(found, call)
            if isinstance(receiver, Unknown):
                if (
                    method in TENSOR_IDENTITY
                    or method in UNARY
                    or method in DETACHING
                    or method in ("sum", "mean", "clamp", "exp")
                ):
                    node = self.resolve(receiver)
                    if isinstance(node, ir.Node) and not isinstance(node, ir.Opaque):
                        return self.method_op(method, node, args, kwargs, call)
                    if method in DETACHING:
                        return replace(receiver, text=_code(call), detached=True)
                    if method == "gather":
                        return replace(receiver, distribution=False)
                    if method in TENSOR_IDENTITY:
                        return receiver
                return self.unknown_call(call, method, receiver, args)
            return Unknown(_code(call), (method,), call=True)
        callee = self.eval(func)
        if isinstance(callee, FuncRef):
            return self.inline(callee, call)
        if isinstance(callee, Unknown):
            if callee.module is not None:
                level = len(callee.module) - len(callee.module.lstrip("."))
                module, _, name = callee.module.lstrip(".").rpartition(".")
                module = "." * level + module
                return self.call_module_function(module, name, call, args, kwargs)
            name = callee.names[-1] if callee.names else callee.text
            if name in ("float", "int") and args:
                return self.eval(args[0].value)
            if name == "sum" and args:
                # ``sum(losses.values())`` over a dict of loss terms.
                terms = self.eval(args[0].value)
                if isinstance(terms, Seq) and terms.items and not terms.appended:
                    total = terms.items[0]
                    for item in terms.items[1:]:
                        total = self.binary("add", total, item, call)
                    return total
            if name == "len" and args:
                return ir.Atom(Role.COEFFICIENT, _code(call))
            return self.named_call(name, call, args, kwargs, callee)
        return Unknown(_code(call), ("call",), call=True)

    def call_module_function(
        self,
        module: str,
        name: str,
        call: cst.Call,
        args: list[cst.Arg],
        kwargs: dict[str, cst.BaseExpression],
    ) -> Value:
        level = len(module) - len(module.lstrip("."))
        module = module.lstrip(".")
        if module == "functools" and name == "partial" and args:
            function = self.eval(args[0].value)
            if isinstance(function, Unknown) and function.module is not None:
                function = self.project_function(function.module) or function
            if isinstance(function, FuncRef):
                return replace(
                    function,
                    preset_args=(*function.preset_args, *(self.eval(a.value) for a in args[1:])),
                    preset_kwargs={
                        **function.preset_kwargs,
                        **{k: self.eval(v) for k, v in kwargs.items()},
                    },
                )
        root = module.split(".")[0] if not level else ""
        if root in ("torch", "numpy", "np", "math", "jax", "scipy") or (
            not level and module.startswith("torch")
        ):
            if root != "torch":
                return Unknown(
                    _code(call), (name,), call=True, numpy=True
                )  # no autograd through numpy & co.
            if name in (
                "kl_div",
                "kl_divergence",
                "cross_entropy",
                "nll_loss",
                "logsigmoid",
                "sigmoid",
                "softplus",
                "binary_cross_entropy_with_logits",
                "cat",
            ):
                return ir.Opaque(f"torch.{name}")
            arg_values = [self.eval(a.value) for a in args]
            kw_values = {k: self.eval(v) for k, v in kwargs.items()}
            if (
                name in ("max", "min", "maximum", "minimum")
                and len(arg_values) == 2
                and not kw_values
            ):
                second = arg_values[1]
                if isinstance(second, (ir.Node, Choice)) and not (
                    isinstance(second, ir.Const)
                    and float(second.value).is_integer()
                    and name in ("max", "min")
                ):
                    op = "max" if name in ("max", "maximum") else "min"
                    return self.binary(op, arg_values[0], second, call)
                return ir.Opaque(f"torch.{name}")
            if name in ("max", "min", "maximum", "minimum"):
                return ir.Opaque(f"torch.{name}")  # a reduction with indices, or unknown
            if name == "where" and len(arg_values) == 3:
                # torch.where(mask.bool(), values, 0.0): masking, values * mask.
                # Any other condition (a clip, a comparison) stays opaque.
                condition, chosen, other = arg_values
                if isinstance(condition, ir.Node) and is_mask(condition):
                    origin = self.origin(call)
                    return self.lift2(
                        chosen,
                        other,
                        lambda a, b: (
                            ir.binary("mul", a, condition, origin)
                            if isinstance(b, ir.Const) and b.value == 0
                            else ir.binary(
                                "add",
                                ir.binary("mul", a, condition, origin),
                                ir.binary(
                                    "mul",
                                    b,
                                    ir.binary("sub", ir.Const(1.0), condition, origin),
                                    origin,
                                ),
                                origin,
                            )
                        ),
                        call,
                    )
                return ir.Opaque("torch.where")
            if name == "mse_loss" and len(arg_values) >= 2:
                # F.mse_loss(logp, ref) = mean((logp - ref) ** 2): twice k2.
                reduction = kw_values.get("reduction", Py("mean"))
                origin = self.origin(call)
                squared = self.lift2(
                    arg_values[0],
                    arg_values[1],
                    lambda a, b: ir.Unary("square", ir.binary("sub", a, b, origin), origin=origin),
                    call,
                )
                if isinstance(reduction, Py) and reduction.value in ("mean", "sum"):
                    kind = str(reduction.value)
                    return self.lift1(
                        squared, lambda n: ir.Reduce(kind, Axis.ALL, n, origin=origin), call
                    )
                return squared
            if (
                name in ("stack", "cat")
                and arg_values
                and isinstance(arg_values[0], Seq)
                and arg_values[0].appended
            ):
                # Rows or steps collected in a loop, put back together.
                rows = arg_values[0].items
                if rows and all(same_value(row, rows[0]) or row is rows[0] for row in rows):
                    return rows[0]
                return Unknown(_code(call), ("stack",), call=True)
            if name == "stack" and arg_values and isinstance(arg_values[0], Seq):
                items = arg_values[0].items
                if items and all(isinstance(i, (ir.Node, Choice)) for i in items):
                    return arg_values[0]
                return Unknown(_code(call), ("stack",), call=True)
            if name == "zeros_like":
                return ir.Const(0.0, origin=self.origin(call))
            if name == "ones_like":
                return ir.Const(1.0, origin=self.origin(call))
            if (
                name in ("tensor", "as_tensor", "scalar_tensor")
                and arg_values
                and isinstance(arg_values[0], ir.Const)
            ):
                return arg_values[0]
            if name in LOGPROB_OPS or name == "log_softmax":
                return self.logprob_call(call, name, args)
            if arg_values:
                return self.tensor_op(name, arg_values[0], arg_values[1:], kw_values, call)
            return Unknown(_code(call), (name,), call=True)
        imported = self.context.project.resolve_module(module, self.module.path, level)
        if imported is None:
            # ``from pkg.mod import fn`` where fn is a submodule attribute or unresolved
            return self.named_call(name, call, args, kwargs, None)
        if name in imported.functions:
            return self.inline(FuncRef(imported.functions[name], imported), call)
        if name in imported.imports:
            target = imported.imports[name]
            if target.name is not None:
                resolved = self.context.project.resolve_module(
                    target.module, imported.path, target.level
                )
                if resolved is not None and target.name in resolved.functions:
                    return self.inline(FuncRef(resolved.functions[target.name], resolved), call)
        return self.named_call(name, call, args, kwargs, None)

    def project_function(self, dotted: str) -> FuncRef | None:
        """``pkg.losses.kl_penalty`` (dots first for a relative import) as a
        function of the project, following one re-export."""
        level = len(dotted) - len(dotted.lstrip("."))
        module_name, _, name = dotted.lstrip(".").rpartition(".")
        imported = self.context.project.resolve_module(module_name, self.module.path, level)
        if imported is None:
            return None
        if name in imported.functions:
            return FuncRef(imported.functions[name], imported)
        target = imported.imports.get(name)
        if target is not None and target.name is not None:
            resolved = self.context.project.resolve_module(
                target.module, imported.path, target.level
            )
            if resolved is not None and target.name in resolved.functions:
                return FuncRef(resolved.functions[target.name], resolved)
        return None

    def named_call(
        self,
        name: str,
        call: cst.Call,
        args: list[cst.Arg],
        kwargs: dict[str, cst.BaseExpression],
        callee: Unknown | None,
    ) -> Value:
        if name in AGGREGATORS and args:
            values = [self.eval(a.value) for a in args]
            kw = {k: self.eval(v) for k, v in kwargs.items()}
            mask = values[1] if len(values) > 1 else kw.get("mask", kw.get("loss_mask"))
            dim = values[2] if len(values) > 2 else kw.get("dim", kw.get("axis"))
            axis = _axis(dim)
            kind = "sum" if "sum" in name else "mean"
            origin = self.origin(call)
            mask_node = self.as_node(mask, call) if mask is not None else None
            return self.lift1(
                values[0], lambda n: ir.Reduce(kind, axis, n, mask_node, origin=origin), call
            )
        if roles.is_logprob_name(name) or name in LOGPROB_OPS or "log_softmax" in name:
            return self.logprob_call(call, name, args)
        credited = self.advantage_estimator(name, call)
        if credited is not None:
            return credited
        return Unknown(_code(call), (name,), call=True, reference_model=self._reference_args(call))

    def advantage_estimator(self, name: str, call: cst.Call) -> ir.Node | None:
        """An advantage/return estimator kllint cannot read (``compute_gae`` passed
        in, from another library) given per-token rewards that contain a KL:
        modelled as the reward-to-go of those rewards, which is what GAE with
        gamma = lambda = 1 computes (a critic baseline adds no expected gradient)."""
        if not roles.has_words(name, _ADVANTAGE_ESTIMATOR_WORDS):
            return None
        for arg in call.args:
            value = self.eval(arg.value)
            if isinstance(value, ir.Node) and value.has_role(Role.REFERENCE_LOGP):
                return ir.CumSum(value, reverse=True, origin=self.origin(call))
        return None

    def _reference_args(self, call: cst.Call) -> bool:
        names = [n for a in call.args for n in _chain_names(a.value)]
        func_names = _chain_names(call.func)
        return self.context.role_patterns.is_reference_model(names + func_names)

    def logprob_call(self, call: cst.Call, name: str, args: list[cst.Arg]) -> Value:
        hints = [n for a in args[:1] for n in _chain_names(a.value)]
        return Unknown(
            _code(call),
            (name, *hints),
            call=True,
            reference_model=self._reference_args(call),
            logprob_op=True,
            distribution=name == "log_softmax",
        )

    def unknown_call(
        self, call: cst.Call, method: str, receiver: Unknown, args: list[cst.Arg]
    ) -> Value:
        if method in ("parse_args", "parse_known_args"):
            # An argparse namespace: its attributes take the parser's defaults.
            args_value = Unknown("args", ("args",))
            return (
                Seq([args_value, Unknown("extra", ("extra",))])
                if method == "parse_known_args"
                else args_value
            )
        if method in ("size", "numel", "dim") and receiver.module is None:
            return ir.Atom(Role.COEFFICIENT, _code(call))
        if method == "log_prob":
            return Unknown(
                _code(call),
                (*receiver.names, "log_prob"),
                call=True,
                reference_model=self.context.role_patterns.is_reference_model(receiver.names),
                logprob_op=True,
                stored=False,
            )
        if method in AGGREGATORS:
            return self.named_call(
                method,
                call,
                args,
                {a.keyword.value: a.value for a in call.args if a.keyword is not None},
                None,
            )
        if roles.is_logprob_name(method) or method in LOGPROB_OPS:
            return self.logprob_call(call, method, args)
        credited = self.advantage_estimator(method, call)
        if credited is not None:
            return credited
        return Unknown(
            _code(call),
            (*receiver.names, method),
            call=True,
            reference_model=self._reference_args(call)
            or self.context.role_patterns.is_reference_model(receiver.names),
        )

    def inline(self, ref: FuncRef, call: cst.Call) -> Value:
        key = id(ref.node)
        if self.depth >= MAX_DEPTH or key in self.stack:
            return Unknown(_code(call), (ref.node.name.value,), call=True)
        bound: dict[str, Value] = {}
        params = ref.node.params
        positional = [*params.posonly_params, *params.params]
        if ref.bound and positional and positional[0].name.value in ("self", "cls"):
            bound[positional[0].name.value] = Unknown("self", ("self",))
            positional = positional[1:]
        elif ref.cls is not None and positional and positional[0].name.value in ("self", "cls"):
            positional = positional[1:]
        index = 0
        for preset in ref.preset_args:
            if index < len(positional):
                bound[positional[index].name.value] = preset
                index += 1
        bound.update(ref.preset_kwargs)
        for arg in call.args:
            if arg.star:
                return Unknown(_code(call), (ref.node.name.value,), call=True)
            value = self.eval(arg.value)
            if arg.keyword is not None:
                bound[arg.keyword.value] = value
            elif index < len(positional):
                bound[positional[index].name.value] = value
                index += 1
        site = self.call_site or self.origin(call)
        if self.call_site is None:
            site = ir.Origin(
                self.context.path,
                helper=_helper_label(ref, self.context),
                cst_node=call,
                helper_node=ref.node,
            )
        callee = Interpreter(
            self.context,
            ref.module,
            ref.cls,
            depth=self.depth + 1,
            call_site=site,
            stack=(*self.stack, key),
            function_name=ref.node.name.value,
        )
        callee.root = self.root
        # Parameters the caller did not pass take their defaults, evaluated in
        # the callee's module: that is how a keyword default picks a branch.
        result = callee.run_function(ref.node, bound, no_grad=self.no_grad)
        if result is None:
            return Py(None)
        return self.credit_rewards(ref.node.name.value, call, result)

    def credit_rewards(self, name: str, call: cst.Call, result: Value) -> Value:
        """A helper named like an advantage estimator (``compute_gae``) whose
        loop kllint cannot follow loses the rewards it was given; model its
        results as their reward-to-go (see ``advantage_estimator``)."""
        credited = self.advantage_estimator(name, call)
        if credited is None:
            return result

        def keep(value: Value) -> bool:
            return isinstance(value, ir.Node) and value.has_role(Role.REFERENCE_LOGP)

        if isinstance(result, Seq):
            return Seq([item if keep(item) else credited for item in result.items])
        return result if keep(result) else credited

    # ----------------------------------------------------------------- tensor operations

    def method_op(
        self,
        name: str,
        receiver: Value,
        args: list[cst.Arg],
        kwargs: dict[str, cst.BaseExpression],
        call: cst.Call,
    ) -> Value:
        """``receiver.name(*args, **kwargs)`` on a tensor, arguments evaluated."""
        return self.tensor_op(
            name,
            receiver,
            [self.eval(a.value) for a in args],
            {k: self.eval(v) for k, v in kwargs.items()},
            call,
        )

    def gathered(self, value: Value, call: cst.Call) -> Value:
        """``log_probs.gather(-1, ids)``: the log-prob of the sampled token."""
        if isinstance(value, Unknown):
            return replace(value, distribution=False)
        return self.lift1(value, to_token_level, call)

    def tensor_op(
        self,
        name: str,
        receiver: Value,
        args: list[Value],
        kwargs: dict[str, Value],
        call: cst.Call,
    ) -> Value:
        origin = self.origin(call)
        if name == "gather":
            return self.gathered(receiver, call)
        if name in TENSOR_IDENTITY:
            return receiver
        if name in DETACHING:
            return self.lift1(receiver, lambda n: ir.detach(n, origin), call)
        if name in UNARY:
            op = UNARY[name]
            return self.lift1(
                receiver,
                lambda n: ir.neg(n, origin) if op == "neg" else ir.Unary(op, n, origin=origin),
                call,
            )
        if name in BINARY_METHODS:
            other = args[0] if args else kwargs.get("other", kwargs.get("exponent", Py(None)))
            return self.binary(BINARY_METHODS[name], receiver, other, call)
        if name in ("clamp", "clip", "clamp_min", "clamp_max", "clip_"):
            low = kwargs.get("min", args[0] if args else None)
            high = kwargs.get("max", args[1] if len(args) > 1 else None)
            if name == "clamp_max":
                low, high = None, low
            lo, hi = _float(low), _float(high)
            return self.lift1(receiver, lambda n: ir.Clamp(n, lo, hi, origin=origin), call)
        if name in ("sum", "mean", "nansum", "nanmean"):
            dim = kwargs.get("dim", kwargs.get("axis", args[0] if args else None))
            kind = "sum" if "sum" in name else "mean"
            axis = _axis(dim)
            if axis is Axis.TIME and has_distribution(receiver):
                return self.lift1(receiver, lambda n: vocabulary_expectation(kind, n, origin), call)
            if isinstance(receiver, Flipped):
                receiver = receiver.node if axis is not Axis.BATCH else receiver
            return self.lift1(receiver, lambda n: ir.Reduce(kind, axis, n, origin=origin), call)
        if name == "cumsum":
            if isinstance(receiver, Flipped):
                return Flipped(ir.CumSum(receiver.node, reverse=True, origin=origin))
            return self.lift1(receiver, lambda n: ir.CumSum(n, reverse=False, origin=origin), call)
        if name in ("flip", "fliplr"):
            if isinstance(receiver, Flipped):
                return receiver.node
            if isinstance(receiver, ir.Node):
                return Flipped(receiver)
            return ir.Opaque("flip")
        if name in ("log_softmax", "softmax"):
            return ir.Opaque(name)
        if name in ("size", "numel", "dim"):
            return ir.Atom(Role.COEFFICIENT, _code(call))
        if name in ("item",):
            return self.lift1(receiver, lambda n: ir.detach(n, origin), call)
        return ir.Opaque(f".{name}()")


# --------------------------------------------------------------------- helpers

_BINOPS = {"Add": "add", "Subtract": "sub", "Multiply": "mul", "Divide": "div", "Power": "pow"}
_SELECTOR_WORDS = frozenset(
    {"kind", "estimator", "estimate", "variant", "approx", "approximation", "kl"}
)
_ADVANTAGE_ESTIMATOR_WORDS = frozenset(
    {"gae", "advantage", "advantages", "return", "returns", "rtg"}
)
_CONFIG_WORDS = frozenset(
    {
        "config",
        "cfg",
        "args",
        "opt",
        "opts",
        "hparams",
        "params",
        "conf",
        "settings",
        "options",
        "training",
        "hyperparams",
    }
)


def _discount_of(step: ir.Node, carried: ir.Node) -> ir.Node | None:
    """The factor of the carried value in a recurrence: ``gamma * lam`` in
    ``delta + gamma * lam * lastgaelam``; None for 1 or a shape other than a
    sum of terms with one scaled carried value."""
    if step is carried:
        return None
    if isinstance(step, ir.Binary) and step.op == "add":
        if ir.contains(step.left, carried) != ir.contains(step.right, carried):
            side = step.left if ir.contains(step.left, carried) else step.right
            return _discount_of(side, carried)
    if isinstance(step, ir.Binary) and step.op == "mul":
        if ir.contains(step.left, carried) != ir.contains(step.right, carried):
            left_carries = ir.contains(step.left, carried)
            inner, factor = (step.left, step.right) if left_carries else (step.right, step.left)
            rest = _discount_of(inner, carried)
            return factor if rest is None else ir.binary("mul", factor, rest)
    return None


def _tensor_like(value: Value) -> bool:
    """A tensor expression, or an unknown value named or produced like one (a
    mask, a log-prob, rollout data): never None where the code uses it."""
    if isinstance(value, ir.Node):
        return True
    if not isinstance(value, Unknown):
        return False
    if value.logprob_op or value.stored:
        return True
    last = value.names[-1] if value.names else ""
    return roles.weight_role(last) is Role.MASK or roles.is_logprob_name(last)


def _compare(operator: cst.BaseCompOp, left: Value, right: Value) -> bool | None:
    def literal(v: Value) -> tuple[bool, object]:
        if isinstance(v, Py):
            return True, v.value
        if isinstance(v, ir.Const):
            return True, v.value
        if isinstance(v, Seq):
            items = [literal(i) for i in v.items]
            if all(ok for ok, _ in items):
                return True, tuple(x for _, x in items)
        return False, None

    lok, lv = literal(left)
    rok, rv = literal(right)
    if isinstance(operator, (cst.Is, cst.IsNot)) and (
        (_tensor_like(left) and rok and rv is None) or (_tensor_like(right) and lok and lv is None)
    ):
        # A tensor argument (``mask`` passed to ``masked_mean``) is not None.
        return isinstance(operator, cst.IsNot)
    if not (lok and rok):
        return None
    try:
        if isinstance(operator, cst.Equal):
            return bool(lv == rv)
        if isinstance(operator, cst.NotEqual):
            return bool(lv != rv)
        if isinstance(operator, cst.In):
            return bool(lv in rv)  # type: ignore[operator]
        if isinstance(operator, cst.NotIn):
            return bool(lv not in rv)  # type: ignore[operator]
        if isinstance(operator, cst.Is):
            return lv is rv if rv is None or isinstance(rv, bool) else None
        if isinstance(operator, cst.IsNot):
            return lv is not rv if rv is None or isinstance(rv, bool) else None
        if isinstance(operator, cst.GreaterThan):
            return bool(lv > rv)  # type: ignore[operator]
        if isinstance(operator, cst.LessThan):
            return bool(lv < rv)  # type: ignore[operator]
        if isinstance(operator, cst.GreaterThanEqual):
            return bool(lv >= rv)  # type: ignore[operator]
        if isinstance(operator, cst.LessThanEqual):
            return bool(lv <= rv)  # type: ignore[operator]
    except TypeError:
        return None
    return None


def _axis(dim: Value | None) -> Axis:
    if dim is None or (isinstance(dim, Py) and dim.value is None):
        return Axis.ALL
    value: object = dim.value if isinstance(dim, (Py, ir.Const)) else None
    if isinstance(dim, Seq):
        return Axis.ALL
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


def _descendants(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    yield node
    for child in node.children:
        yield from _descendants(child)


def _time_loop_direction(statement: cst.For | cst.While) -> str | None:
    """``reversed(range(T))`` or ``range(T - 1, -1, -1)``: a backward loop
    over time; ``range(T)``: forward; anything else: not a loop over time."""
    if not isinstance(statement, cst.For) or not isinstance(statement.iter, cst.Call):
        return None
    call = statement.iter
    name = dotted_name(call.func)
    if name == "reversed" and call.args and isinstance(call.args[0].value, cst.Call):
        inner = dotted_name(call.args[0].value.func)
        return "reverse" if inner == "range" else None
    if name == "range":
        if len(call.args) == 3:
            step = call.args[2].value
            if isinstance(step, cst.UnaryOperation) and isinstance(step.operator, cst.Minus):
                return "reverse"
        return "forward"
    return None


def _assigned_names(body: cst.BaseSuite) -> list[str]:
    """Names a loop body assigns (``x = ...``, ``x += ...``), in order."""
    names: list[str] = []

    class _Assigned(cst.CSTVisitor):
        def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
            if isinstance(node.target, cst.Name) and node.target.value not in names:
                names.append(node.target.value)

        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            if isinstance(node.target, cst.Name) and node.target.value not in names:
                names.append(node.target.value)

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return False

    body.visit(_Assigned())
    return names


_LAMBDAS: dict[int, tuple[cst.Lambda, cst.FunctionDef]] = {}


def _lambda_as_function(node: cst.Lambda) -> cst.FunctionDef:
    """``lambda lp, ref: lp - ref`` as ``def lambda(lp, ref): return lp - ref``,
    made once per lambda so that recursion guards see one function."""
    cached = _LAMBDAS.get(id(node))
    if cached is not None and cached[0] is node:
        return cached[1]
    function = cst.FunctionDef(
        name=cst.Name("lambda"),
        params=node.params,
        body=cst.IndentedBlock(body=[cst.SimpleStatementLine(body=[cst.Return(value=node.body)])]),
    )
    _LAMBDAS[id(node)] = (node, function)
    return function


def _is_one_log_prob(value: Value) -> bool:
    """A value that is one policy (or behaviour) log-prob, possibly detached."""
    if not isinstance(value, ir.Node):
        return False
    atoms = {(a.role, a.name) for a in value.atoms()}
    return len(atoms) == 1 and next(iter(atoms))[0] in (Role.POLICY_LOGP, Role.OLD_LOGP)


def _class_constant(module: ModuleInfo, class_name: str, attr: str) -> Py | None:
    info = module.classes.get(class_name)
    if info is None:
        return None
    for statement in info.node.body.body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            target = None
            if isinstance(small, cst.Assign) and len(small.targets) == 1:
                target, value = small.targets[0].target, small.value
            elif isinstance(small, cst.AnnAssign) and small.value is not None:
                target, value = small.target, small.value
            if isinstance(target, cst.Name) and target.value == attr:
                if isinstance(value, cst.SimpleString) and isinstance(value.evaluated_value, str):
                    return Py(value.evaluated_value)
                if isinstance(value, cst.Integer):
                    return Py(int(value.value, 0))
    return None


def _annotation_of(fn: cst.FunctionDef, name: str) -> cst.BaseExpression | None:
    params = fn.params
    for param in [*params.posonly_params, *params.params, *params.kwonly_params]:
        if param.name.value == name and param.annotation is not None:
            return param.annotation.annotation
    return None


def _is_selector_literal(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, (cst.SimpleString, cst.Integer)) or (
        isinstance(expr, cst.Name) and expr.value in ("True", "False")
    )


def _decorated_no_grad(fn: cst.FunctionDef) -> bool:
    for decorator in fn.decorators:
        expr = decorator.decorator
        name = dotted_name(expr.func) if isinstance(expr, cst.Call) else dotted_name(expr)
        if name is not None and name.split(".")[-1] in _NO_GRAD:
            return True
    return False


def _is_container_chain(names: tuple[str, ...]) -> bool:
    return any(w in roles.CONTAINER_WORDS for n in names for w in roles.words(n))


def _chain_names(expr: cst.BaseExpression) -> list[str]:
    if isinstance(expr, cst.Name):
        return [expr.value]
    if isinstance(expr, cst.Attribute):
        return [*_chain_names(expr.value), expr.attr.value]
    if isinstance(expr, cst.Subscript):
        key = _string_key(expr)
        return [*_chain_names(expr.value), *([key] if key else [])]
    if isinstance(expr, cst.Call):
        return _chain_names(expr.func)
    return []


def _string_key(expr: cst.Subscript) -> str | None:
    if len(expr.slice) == 1 and isinstance(expr.slice[0].slice, cst.Index):
        inner = expr.slice[0].slice.value
        if isinstance(inner, cst.SimpleString):
            value = inner.evaluated_value
            return value if isinstance(value, str) else None
    return None


def _helper_label(ref: FuncRef, context: FileContext) -> str:
    path = ref.module.path
    try:
        shown = path.relative_to(Path.cwd()).as_posix()
    except ValueError:
        shown = path.as_posix()
    line = ref.module.line_of_def(ref.node.name.value)
    return (
        f"`{ref.node.name.value}` ({shown}:{line})"
        if line
        else f"`{ref.node.name.value}` ({shown})"
    )


_EMPTY_MODULE = cst.Module(body=[])


def _code(node: cst.CSTNode) -> str:
    """A short spelling of an expression for messages and evidence: names and
    attribute chains in full, calls and subscripts abbreviated. Generating the
    code of every unknown value in full cost more than parsing the file."""
    if isinstance(node, (cst.Name, cst.Attribute)):
        dotted = dotted_name(node)
        if dotted is not None:
            return dotted
    if isinstance(node, cst.Call):
        return f"{_code(node.func)}(...)"
    if isinstance(node, cst.Subscript):
        key = _string_key(node)
        return f"{_code(node.value)}[{key!r}]" if key is not None else f"{_code(node.value)}[...]"
    if isinstance(node, (cst.Integer, cst.Float, cst.SimpleString)):
        return node.value
    return _full_code(node)


def _full_code(node: cst.CSTNode) -> str:
    try:
        text = _EMPTY_MODULE.code_for_node(node)
    except Exception:  # pragma: no cover - code generation of a partial node
        return type(node).__name__
    return " ".join(text.split())


_CALL = re.compile(
    r"(?:(?<![\w.])(?<!def )(?<!class )|(?<=\bself\.)|(?<=\bcls\.))([A-Za-z_]\w*)\s*\("
)


def called_names(source: str) -> frozenset[str]:
    """Functions and methods a module calls by name (``f(...)``, ``self.f(...)``).
    A text scan: a LibCST visitor over the whole module costs more than the parse."""
    return frozenset(_CALL.findall(source))


def iter_functions(module: ModuleInfo) -> Iterator[tuple[cst.FunctionDef, ClassInfo | None]]:
    """Every function and method of a module, nested ones included."""

    def nested(
        fn: cst.FunctionDef, cls: ClassInfo | None
    ) -> Iterator[tuple[cst.FunctionDef, ClassInfo | None]]:
        yield fn, cls
        for child in _walk_defs(fn.body):
            yield from nested(child, cls)

    for fn in module.functions.values():
        yield from nested(fn, None)
    for cls in module.classes.values():
        for method in cls.methods.values():
            yield from nested(method, cls)


def _walk_defs(body: cst.BaseSuite) -> Iterator[cst.FunctionDef]:
    if not isinstance(body, cst.IndentedBlock):
        return
    for statement in body.body:
        if isinstance(statement, cst.FunctionDef):
            yield statement
        elif isinstance(statement, (cst.If, cst.For, cst.While, cst.With, cst.Try)):
            yield from _walk_defs(statement.body)
