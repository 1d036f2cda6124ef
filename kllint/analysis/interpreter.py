"""Lowering code to the KL expression IR: an abstract interpreter over one
function's statements. This module holds Python semantics only: statements,
branches, loops (as scans over time), expressions, calls and the inlining of
helpers. What the values mean comes from one module per vocabulary:

* ``lowering``: torch functions and tensor methods;
* ``roles``: which tensor is the policy, the reference, a mask, ...;
* ``selectors``: where a selector's value comes from, how a branch is labelled;
* ``sinks``: what counts as a loss;
* ``project``: modules, classes, functions and re-exports of the project.

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

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import libcst as cst

from kllint.analysis import ir, lowering, roles, selectors, sinks
from kllint.analysis.ir import Role
from kllint.analysis.lowering import (
    AGGREGATORS,
    DETACHING,
    IN_PLACE,
    LOGPROB_OPS,
    MUTATING,
    NO_GRAD,
    TENSOR_IDENTITY,
    UNARY,
    TorchCall,
)
from kllint.analysis.module import ClassInfo, ModuleInfo, dotted_name
from kllint.analysis.project import Project
from kllint.analysis.sinks import Sink
from kllint.analysis.syntax import chain_names, code, full_code, string_key
from kllint.analysis.values import (
    AND,
    HIDDEN,
    Choice,
    DictVal,
    Flipped,
    FuncRef,
    Py,
    Seq,
    Unknown,
    Value,
    binary,
    choice,
    lift1,
    lift2,
    merge_envs,
    negate_condition,
)

MAX_DEPTH = 4  # helpers inlined inside helpers, at most


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
        self.loss_function = sinks.is_loss_function(
            fn.name.value, self.cls.node.name.value if self.cls else None, self.context.called
        )
        params = fn.params
        for param in [*params.posonly_params, *params.params, *params.kwonly_params]:
            name = param.name.value
            if bound is not None and name in bound:
                self.env[name] = bound[name]
            elif param.default is not None and (
                bound is not None or selectors.is_selector_literal(param.default)
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
                if (name is not None and name.split(".")[-1] in NO_GRAD) or (
                    isinstance(item.item, cst.Call)
                    and isinstance(item.item.func, cst.Attribute)
                    and item.item.func.attr.value == "set_grad_enabled"
                ):
                    self.no_grad = True
                if item.asname is not None:
                    self.assign(item.asname.name, Unknown(code(item.item), ("context",)), item)
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
                scan = ir.CumSum(added, reverse=reverse, origin=step.origin)
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
            self.assign(target, Unknown(code(iterable), ("loop",)), node)

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
        subject_text = full_code(statement.subject)
        cases = list(statement.cases)

        def run(index: int) -> bool:
            if index >= len(cases):
                return False
            case = cases[index]
            truth = self.pattern_truth(subject, case.pattern)
            if case.guard is not None and truth is not False:
                guard = self.truth(case.guard)
                truth = False if guard is False else (truth if guard is True else None)
            text = f"{subject_text} == {full_code(case.pattern)}"
            selects = selectors.selects_estimator(
                statement.subject, case.pattern, text, in_helper=self.depth > 0
            )
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
        return selectors.condition_label(test, in_helper=self.depth > 0)

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
                else Unknown(code(small), ("augassign",))
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
                value = self.lift1(value, ir.detach)
            self.returns.append((AND.join(self.path), value))
            if self.loss_function and self.depth == 0:
                self.loss_sink_from_return(small, value)
            return True
        elif isinstance(small, cst.Raise):
            return True
        return False

    def loss_sink_from_return(self, node: cst.Return, value: Value) -> None:
        for item, description in sinks.returned_losses(self.function_name, node.value, value):
            self.add_sink(item, description, True, node)

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
            value = self.lift1(value, ir.detach)
        if isinstance(target, cst.Name):
            name = target.value
            patterns = self.context.role_patterns
            if not isinstance(value, Unknown) and (
                patterns.logprob_role(name) is not None
                or (patterns.role_from_words(name) is not None and roles.is_one_log_prob(value))
            ):
                value = roles.name_logprob(name, value, patterns, no_grad=self.no_grad)
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
            if sinks.is_loss_name(name):
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
                    item = Unknown(code(element), ("unpacked",))
                self.assign(element, item, node)
        elif isinstance(target, cst.Subscript) and isinstance(target.value, cst.Name):
            container = self.env.get(target.value.value)
            key = string_key(target)
            if isinstance(container, (ir.Node, Seq)):
                # ``buffer[:, i] = ...`` fills a tensor in place: it is no longer what it was.
                self.env[target.value.value] = Unknown(target.value.value, (target.value.value,))
            if isinstance(container, DictVal) and key is not None:
                container.items[key] = value
                if sinks.is_loss_name(key):
                    self.add_sink(value, f"the loss entry `{key}`", False, node)

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
            return Unknown(code(expr), ("deep",))

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
                return self.lift1(operand, lambda n: ir.neg(n, self.origin(expr)))
            if isinstance(expr.operator, cst.Plus):
                return operand
            if isinstance(expr.operator, cst.Not):
                truth = self.truth(expr.expression)
                return Py(not truth) if truth is not None else Unknown(code(expr), ("not",))
            return Unknown(code(expr), ("unary",))
        if isinstance(expr, cst.BinaryOperation):
            op = _BINOPS.get(type(expr.operator).__name__)
            left, right = self.eval(expr.left), self.eval(expr.right)
            if op is None:
                return Unknown(code(expr), ("binop",))
            return self.binary(op, left, right, expr)
        if isinstance(expr, (cst.Comparison, cst.BooleanOperation)):
            truth = self.truth(expr)
            return Py(truth) if truth is not None else Unknown(code(expr), ("condition",))
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
        return Unknown(code(expr), (type(expr).__name__,))

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
        return Unknown(code(expr), ("comprehension",))

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
                return self.lift1(base, lambda n: ir.detach(n, self.origin(expr)))
            if attr in ("T", "mT", "real"):
                return base
            if attr == "shape":
                # Sizes are positive constants: a normaliser, not a gradient path.
                return ir.Atom(Role.COEFFICIENT, code(expr))
            return Unknown(code(expr), (attr,))
        if isinstance(base, Unknown) and base.class_name is not None:
            member = selectors.class_constant(self.module, base.class_name, attr)
            if member is not None:
                return member  # ``KLEstimator.K3``: an Enum member stands for its value
        if isinstance(base, Py) and attr in ("value", "name"):
            return base if attr == "value" else Py(None)
        if isinstance(base, Unknown) and attr == "shape" and base.module is None:
            return ir.Atom(Role.COEFFICIENT, code(expr))
        if isinstance(base, Unknown):
            unknown = replace(
                base,
                text=code(expr),
                names=(*base.names, attr),
                stored=base.stored or (not base.call and roles.from_container(base.names)),
                detached=base.detached or attr == "data",
                module=f"{base.module}.{attr}" if base.module else None,
                distribution=False,
                class_name=None,
            )
            default = selectors.config_default(
                self.context.project,
                self.context.fs_path,
                self.module,
                self.function_node,
                self.cls,
                base,
                attr,
            )
            return default if default is not None else unknown
        if isinstance(base, (FuncRef, Py)):
            return Unknown(code(expr), (attr,))
        return Unknown(code(expr), (attr,))

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
            return base.items.get(key_value.value, Unknown(code(expr), (key_value.value,)))
        if (
            isinstance(base, DictVal)
            and base.items
            and key_value is not None
            and not isinstance(key_value, Py)
        ):
            # A dispatch table indexed by a selector kllint cannot resolve.
            label = full_code(expr.slice[0].slice)
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
                label = full_code(expr.slice[0].slice)
                return choice([(f"{label} == {i}", item) for i, item in enumerate(base.items)])
            return Unknown(code(expr), ("slice",))
        if isinstance(base, Unknown):
            key = (
                key_value.value
                if isinstance(key_value, Py) and isinstance(key_value.value, str)
                else None
            )
            # Slicing keeps what a tensor is; a string key names what it holds.
            return replace(
                base,
                text=code(expr),
                names=(*base.names, key) if key else base.names,
                stored=base.stored or (not base.call and roles.from_container(base.names)),
                module=None,
                class_name=None,
            )
        if isinstance(base, (ir.Node, Choice, Flipped)):
            return base  # slicing a tensor keeps what it is
        return Unknown(code(expr), ("subscript",))

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
                        note = selectors.default_note(expr.left, side)
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
        return binary(op, left, right, self.origin(node), self.as_node)

    def lift1(self, value: Value, fn: Callable[[ir.Node], ir.Node]) -> Value:
        return lift1(value, fn, self.as_node)

    def lift2(self, left: Value, right: Value, fn: Callable[[ir.Node, ir.Node], ir.Node]) -> Value:
        return lift2(left, right, fn, self.as_node)

    def torch_call(self, call: cst.CSTNode) -> TorchCall:
        return TorchCall(self.origin(call), call, self.as_node)

    # ----------------------------------------------------------------- calls

    def eval_call(self, call: cst.Call) -> Value:
        func = call.func
        args = [a for a in call.args if a.keyword is None and a.star == ""]
        kwargs = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
        if isinstance(func, cst.Attribute):
            return self.eval_method_call(call, func, args, kwargs)
        callee = self.eval(func)
        if isinstance(callee, FuncRef):
            return self.inline(callee, call)
        if isinstance(callee, Unknown):
            if callee.module is not None:
                level = len(callee.module) - len(callee.module.lstrip("."))
                module, _, name = callee.module.lstrip(".").rpartition(".")
                module = "." * level + module
                return self.call_module_function(module, name, call, args, kwargs)
            return self.call_builtin(callee, call, args, kwargs)
        return Unknown(code(call), ("call",), call=True)

    def call_builtin(
        self,
        callee: Unknown,
        call: cst.Call,
        args: list[cst.Arg],
        kwargs: dict[str, cst.BaseExpression],
    ) -> Value:
        """A call by a plain name that is no function of the project."""
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
            return ir.Atom(Role.COEFFICIENT, code(call))
        return self.named_call(name, call, args, kwargs, callee)

    def eval_method_call(
        self,
        call: cst.Call,
        func: cst.Attribute,
        args: list[cst.Arg],
        kwargs: dict[str, cst.BaseExpression],
    ) -> Value:
        method = func.attr.value
        if method in sinks.BACKWARD_METHODS:
            target = args[0].value if args else func.value
            value = self.eval(target)
            self.add_sink(
                value,
                sinks.backward_description(full_code(call), method),
                True,
                call,
                backward=True,
            )
            return Py(None)
        receiver = self.eval(func.value)
        if isinstance(receiver, DictVal) and method == "values" and not args:
            return Seq(list(receiver.items.values()))
        if isinstance(func.value, cst.Name) and self.mutate(
            func.value.value, method, args, kwargs, call
        ):
            return Py(None)
        if isinstance(receiver, Unknown) and receiver.module is not None:
            return self.call_module_function(receiver.module, method, call, args, kwargs)
        if method == "scale" and isinstance(receiver, Unknown) and len(args) == 1:
            # ``scaler.scale(loss).backward()`` (AMP): the scaled loss is the loss.
            scaled = self.eval(args[0].value)
            if isinstance(scaled, (ir.Node, Choice)):
                return scaled
        if isinstance(receiver, (ir.Node, Choice, Flipped)) and not isinstance(receiver, ir.Opaque):
            return self.method_op(method, receiver, args, kwargs, call)
        if isinstance(receiver, Unknown):
            if receiver.names == ("self",) and self.cls is not None:
                found = self.context.project.method(self.cls, self.module, method)
                if found is not None:
                    return self.inline(found, call)
            return self.unknown_method(call, method, receiver, args, kwargs)
        return Unknown(code(call), (method,), call=True)

    def mutate(
        self,
        name: str,
        method: str,
        args: list[cst.Arg],
        kwargs: dict[str, cst.BaseExpression],
        call: cst.Call,
    ) -> bool:
        """``rows.append(x)``, ``kl.mul_(mask)``, ``buffer.copy_(x)`` on a local:
        the local becomes what the method makes of it. True when handled."""
        current = self.env.get(name)
        if method == "append" and isinstance(current, Seq) and args:
            self.env[name] = Seq([*current.items, self.eval(args[0].value)], appended=True)
            return True
        if method in IN_PLACE and isinstance(current, (ir.Node, Choice)):
            # ``kl.mul_(mask)``: the tensor becomes what the operation gives.
            self.env[name] = self.method_op(IN_PLACE[method], current, args, kwargs, call)
            return True
        if method in MUTATING and name in self.env:
            self.env[name] = Unknown(name, (name,))
            return True
        return False

    def unknown_method(
        self,
        call: cst.Call,
        method: str,
        receiver: Unknown,
        args: list[cst.Arg],
        kwargs: dict[str, cst.BaseExpression],
    ) -> Value:
        """A method of a value kllint cannot compute: a tensor method once its
        role is known, else evidence kept on the unknown result."""
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
                return replace(receiver, text=code(call), detached=True)
            if method == "gather":
                return replace(receiver, distribution=False)
            if method in TENSOR_IDENTITY:
                return receiver
        return self.unknown_call(call, method, receiver, args)

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
            partial = self.partial(args, kwargs)
            if partial is not None:
                return partial
        namespace = lowering.namespace(module, level)
        if namespace == "no-autograd":
            return Unknown(code(call), (name,), call=True, numpy=True)
        if namespace == "torch":
            return self.call_torch(name, call, args, kwargs)
        ref = self.context.project.function(module, name, self.module.path, level)
        if ref is not None:
            return self.inline(ref, call)
        # ``from pkg.mod import fn`` where fn is a submodule attribute or unresolved
        return self.named_call(name, call, args, kwargs, None)

    def partial(self, args: list[cst.Arg], kwargs: dict[str, cst.BaseExpression]) -> FuncRef | None:
        """``functools.partial(kl_penalty, kind="mse")``: the function with
        arguments given in advance."""
        function = self.eval(args[0].value)
        if isinstance(function, Unknown) and function.module is not None:
            function = (
                self.context.project.function_at(function.module, self.module.path) or function
            )
        if not isinstance(function, FuncRef):
            return None
        return replace(
            function,
            preset_args=(*function.preset_args, *(self.eval(a.value) for a in args[1:])),
            preset_kwargs={
                **function.preset_kwargs,
                **{k: self.eval(v) for k, v in kwargs.items()},
            },
        )

    def call_torch(
        self,
        name: str,
        call: cst.Call,
        args: list[cst.Arg],
        kwargs: dict[str, cst.BaseExpression],
    ) -> Value:
        """``torch.name(...)``, ``F.name(...)``: the torch vocabulary's lowering."""
        if name in lowering.OPAQUE_FUNCTIONS:
            return ir.Opaque(f"torch.{name}")
        arg_values = [self.eval(a.value) for a in args]
        kw_values = {k: self.eval(v) for k, v in kwargs.items()}
        if name in LOGPROB_OPS or name == "log_softmax":
            return self.logprob_call(call, name, args)
        return lowering.torch_function(self.torch_call(call), name, arg_values, kw_values)

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
            axis = lowering.axis(dim)
            kind = "sum" if "sum" in name else "mean"
            origin = self.origin(call)
            mask_node = self.as_node(mask) if mask is not None else None
            return self.lift1(
                values[0], lambda n: ir.Reduce(kind, axis, n, mask_node, origin=origin)
            )
        if roles.is_logprob_name(name) or name in LOGPROB_OPS or "log_softmax" in name:
            return self.logprob_call(call, name, args)
        credited = self.advantage_estimator(name, call)
        if credited is not None:
            return credited
        return Unknown(code(call), (name,), call=True, reference_model=self._reference_args(call))

    def advantage_estimator(self, name: str, call: cst.Call) -> ir.Node | None:
        """An advantage/return estimator kllint cannot read (``compute_gae`` passed
        in, from another library) given per-token rewards that contain a KL:
        modelled as the reward-to-go of those rewards, which is what GAE with
        gamma = lambda = 1 computes (a critic baseline adds no expected gradient)."""
        if not roles.has_words(name, roles.ADVANTAGE_ESTIMATOR_WORDS):
            return None
        for arg in call.args:
            value = self.eval(arg.value)
            if isinstance(value, ir.Node) and value.has_role(Role.REFERENCE_LOGP):
                return ir.CumSum(value, reverse=True, origin=self.origin(call))
        return None

    def _reference_args(self, call: cst.Call) -> bool:
        names = [n for a in call.args for n in chain_names(a.value)]
        func_names = chain_names(call.func)
        return self.context.role_patterns.is_reference_model(names + func_names)

    def logprob_call(self, call: cst.Call, name: str, args: list[cst.Arg]) -> Value:
        hints = [n for a in args[:1] for n in chain_names(a.value)]
        return Unknown(
            code(call),
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
            return ir.Atom(Role.COEFFICIENT, code(call))
        if method == "log_prob":
            return Unknown(
                code(call),
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
            code(call),
            (*receiver.names, method),
            call=True,
            reference_model=self._reference_args(call)
            or self.context.role_patterns.is_reference_model(receiver.names),
        )

    def inline(self, ref: FuncRef, call: cst.Call) -> Value:
        key = id(ref.node)
        if self.depth >= MAX_DEPTH or key in self.stack:
            return Unknown(code(call), (ref.node.name.value,), call=True)
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
                return Unknown(code(call), (ref.node.name.value,), call=True)
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
                helper=helper_label(ref),
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
        return lowering.tensor_method(
            self.torch_call(call),
            name,
            receiver,
            [self.eval(a.value) for a in args],
            {k: self.eval(v) for k, v in kwargs.items()},
        )


# --------------------------------------------------------------------- helpers

_BINOPS = {"Add": "add", "Subtract": "sub", "Multiply": "mul", "Divide": "div", "Power": "pow"}


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


def _decorated_no_grad(fn: cst.FunctionDef) -> bool:
    for decorator in fn.decorators:
        expr = decorator.decorator
        name = dotted_name(expr.func) if isinstance(expr, cst.Call) else dotted_name(expr)
        if name is not None and name.split(".")[-1] in NO_GRAD:
            return True
    return False


def helper_label(ref: FuncRef) -> str:
    """How a helper is named in messages: ``name`` (path:line)."""
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
