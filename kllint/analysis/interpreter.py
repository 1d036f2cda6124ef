"""Lowering code to the KL expression IR: an abstract interpreter over one
function's statements. This module holds Python semantics only: statements,
branches, loops (as scans over time), expressions, calls and the inlining of
helpers. What the values mean comes from one module per vocabulary:

* ``lowering``: torch functions and tensor methods;
* ``roles``: which tensor is the policy, the reference, a mask, ...;
* ``selectors``: where a selector's value comes from, how a branch is labelled;
* ``sinks``: what counts as a loss;
* ``project``: modules, classes, functions and re-exports of the project.

The interpreter itself is layered, one file each: ``frame`` (the state of one
function), ``expressions``, ``calls``, and this module (statements, branches,
loops as scans, inlining).

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
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import libcst as cst

from kllint.analysis import ir, library, lowering, roles, selectors, sinks, sites
from kllint.analysis.calls import Calls
from kllint.analysis.expressions import BINOPS, compare
from kllint.analysis.frame import MAX_DEPTH, FileContext
from kllint.analysis.gradient import Direction
from kllint.analysis.ir import Role
from kllint.analysis.lowering import split_tensor, splits_by_length
from kllint.analysis.module import (
    CALLED_THROUGH,
    TRIPLE_QUOTED,
    ClassField,
    ClassInfo,
    FunctionNames,
    ModuleInfo,
    dotted_name,
    may_transform,
    names_imported,
    outside_tests,
)
from kllint.analysis.project import Project
from kllint.analysis.sinks import Sink
from kllint.analysis.syntax import (
    chain_names,
    code,
    descendants,
    full_code,
    named_params,
    returned_names,
    string_key,
)
from kllint.analysis.values import (
    AND,
    HIDDEN,
    Choice,
    DictVal,
    Flipped,
    FuncRef,
    Grouped,
    Instance,
    Py,
    Seq,
    Unknown,
    Value,
    choice,
    merge_envs,
    negate_condition,
    note_alternatives,
    note_default,
    shown_key,
    tensors_of,
    written_attribute,
)

__all__ = [
    "FileContext",
    "Interpreter",
    "Sink",
    "called_names",
    "iter_functions",
]


class Interpreter(Calls):
    """Statements, branches, loops and the inlining of helpers."""

    # ----------------------------------------------------------------- functions

    def run_function(
        self, fn: cst.FunctionDef, bound: dict[str, Value] | None = None, *, no_grad: bool = False
    ) -> Value | None:
        self.no_grad = no_grad or lowering.decorated_no_grad(fn)
        self.inference_mode = False
        self.function_name = fn.name.value
        self.function_node = fn
        if self.depth == 0:
            self.root = self.entry_root = fn
        self.loss_function = sinks.is_loss_function(
            fn.name.value,
            self.cls.name if self.cls else None,
            self.context.calls,
            selects=_has_selector_parameter(fn),
            registered=self.context.registered,
        )
        enclosing = self.context.closures.get(id(fn)) if self.depth == 0 else None
        if enclosing is not None:
            # A nested function analysed on its own, after the function it is
            # written in: it sees that function's locals (``kl_fn`` bound by a
            # factory from its config).
            self.env = dict(enclosing())
        params = fn.params
        for param in named_params(fn):
            name = param.name.value
            if bound is not None and name in bound:
                value = bound[name]
                if isinstance(value, Unknown) and value.logprob_op:
                    # ``compute_kl(self.logprobs(model, batch), ref)``: a log-prob
                    # the caller never named is named by the parameter. What the
                    # caller did name keeps its role: a helper's names never
                    # override it (``old_dist.log_prob(tokens)`` given as ``logp``).
                    held = (
                        roles.held_distribution_log_prob(
                            value, self.context.role_patterns, no_grad=self.no_grad
                        )
                        if value.names[-1:] == (lowering.DISTRIBUTION_LOGPROB,)
                        else None
                    )
                    if held is not None:
                        value = held
                    elif _annotated_as_a_distribution(param):
                        # ``base: Categorical``: the name says where the
                        # distribution sits in a wrapper, not whose it is.
                        value = self.resolve(value)
                    else:
                        value = self.resolve(replace(value, names=(*value.names, name)), name)
                self.env[name] = value
            elif (
                param.default is not None
                and (option := selectors.cli_option_default(param.default)) is not None
            ):
                # ``kl_estimator: str = typer.Option("k1")``: the option's default.
                self.env[name] = self.eval(option)
            elif param.default is not None and (
                bound is not None or selectors.is_selector_literal(param.default)
            ):
                # A keyword default picks the branch when the caller (or, for a
                # function analysed on its own, every caller that omits it) does
                # not. Analysed on its own, a function every call of which in its
                # file gives the same literal (``partial(grpo_loss,
                # kl_level="sequence")``) runs with that literal.
                passed = (
                    self.module.literal_every_call_passes(fn.name.value, name)
                    if bound is None
                    else None
                )
                self.env[name] = Py(passed) if passed is not None else self.eval(param.default)
            else:
                self.env[name] = self.param_value(name, fn)
        for star in (params.star_arg, params.star_kwarg):
            if isinstance(star, cst.Param):
                given = bound.get(star.name.value) if bound is not None else None
                self.env[star.name.value] = (
                    given
                    if isinstance(given, Seq)
                    else Unknown(star.name.value, (star.name.value,))
                )
        if isinstance(params.star_kwarg, cst.Param) and bound:
            # ``def _aggregate(self, **terms)`` given ``**loss_terms`` or
            # ``kl_loss=...``: the keywords no parameter takes are its dict.
            named = {p.name.value for p in named_params(fn)}
            extra = {key: value for key, value in bound.items() if key not in named}
            if extra:
                self.env[params.star_kwarg.name.value] = DictVal(extra)
        self.exec_block(fn.body.body if isinstance(fn.body, cst.IndentedBlock) else [fn.body])
        for node, shown, value in self.stored_advantages or self.stored_returns:
            self.advantage_sink(node, value, f"the advantages stored as `{shown}`")
        if not self.context.calls.get(self.function_name):
            # Called in this file, its caller reads the rewards back and is
            # judged by the loss it computes with them. A caller that only
            # hands them on (``apply_kl_penalty(data)``, then the batch to
            # the actor) is where they leave the file, unless it turned them
            # into advantages itself.
            handed_on = [] if self.stored_advantages or self.stored_returns else self.helper_rewards
            for node, shown, value in [*self.stored_rewards, *handed_on]:
                self.advantage_sink(node, value, f"the rewards stored as `{shown}`", rewards=True)
        if self.yielded:
            return Seq(list(self.yielded), generated=True)
        if not self.returns:
            return None
        return choice(self.returns)

    def param_value(self, name: str, fn: cst.FunctionDef) -> Value:
        names = self.module.sketch.functions.get(
            (self.cls.name if self.cls else None, fn.name.value)
        )
        typed = self.callable_of_type(name, fn)
        if typed is not None:
            return typed
        role = roles.bare_policy_role(name, names.identifiers if names is not None else ())
        if role is not None and not _log_probs_taken_of(fn, name):
            # ``def loss(new, old, ref, advantages, mask)``.
            atom: ir.Node = ir.Atom(role, name, roles.level_of(name))
            return ir.detach(atom) if self.no_grad else atom
        unknown = Unknown(name, (name,))
        return self.resolve(unknown, name, keep_unknown=True)

    def callable_of_type(self, name: str, fn: cst.FunctionDef) -> Instance | None:
        """``loss_fn: ReinforceLossFn``: a parameter annotated with a class of
        the project that is called (``__call__``, ``forward``) or has
        properties is an object of that class; calling it (reading them)
        runs the class's code. Its ``__init__``
        is not run: what it was built with is the caller's, and its
        settings are read as ``__init__`` gives them by default."""
        found = self.annotated_class(name, fn)
        if found is None:
            return None
        project = self.context.project
        called = any(project.method(*found, m) is not None for m in ("__call__", "forward"))
        # (``exp: Experience`` whose ``returns`` is a ``cached_property``:
        # reading it runs the property on the object's fields.)
        if not called and not any(
            (method := project.method(*found, m)) is not None and method.is_property
            for m in found[0].methods
        ):
            return None
        return Instance(found[0], found[1], unbuilt=True)

    # ----------------------------------------------------------------- statements

    def exec_block(self, statements: Sequence[cst.CSTNode]) -> bool:
        """Returns True when every path through the block returned."""
        # Statements run after ``model.set_adapter("ref")`` and before the
        # switch back: what they compute with the model is the reference's,
        # as under ``with model.disable_adapter():``.
        on_reference: list[cst.CSTNode] | None = None
        # Statements run while a model is frozen (``actor.requires_grad_(False)``)
        # until it is thawed, here or in a ``finally``: what they compute has
        # no gradient.
        frozen: list[cst.CSTNode] | None = None
        for statement in statements:
            method = _switch_method(statement)
            switch = _adapter_switch(statement) if method == "set_adapter" else None
            if switch is not None:
                if on_reference:
                    self.as_reference(on_reference)
                on_reference = [] if switch else None
            elif on_reference is not None:
                on_reference.append(statement)
            freeze = _freeze_switch(statement) if method == "requires_grad_" else None
            if freeze is not None and freeze[1] and freeze[0] in _thawed_models(statements):
                frozen = []
            elif frozen is not None and freeze is not None and not freeze[1]:
                self.detach_assigned(frozen)
                frozen = None
            elif frozen is not None:
                frozen.append(statement)
            if self.exec_statement(statement):
                return True
            if frozen and isinstance(statement, cst.Try) and _thawed_models([statement]):
                self.detach_assigned(frozen)
                frozen = None
        if on_reference:
            self.as_reference(on_reference)
        return False

    def detach_assigned(self, statements: list[cst.CSTNode]) -> None:
        for name in _assigned_names(cst.IndentedBlock(body=statements), unpacked=True):  # type: ignore[arg-type]
            if name in self.env:
                self.env[name] = self.lift1(self.env[name], ir.detach)

    def as_reference(self, statements: list[cst.CSTNode]) -> None:
        for name in _assigned_names(cst.IndentedBlock(body=statements), unpacked=True):  # type: ignore[arg-type]
            if name in self.env:
                self.env[name] = roles.as_reference(name, self.env[name])

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
            saved = self.no_grad, self.inference_mode
            entered = [self.entered_by_generator(item.item) for item in statement.items]
            for item, (inner, _) in zip(statement.items, entered):
                switch = lowering.grad_switch(self.context_taken(item.item)) or inner
                if switch in ("off", "inference"):
                    self.no_grad = True
                    self.inference_mode = self.inference_mode or switch == "inference"
                elif switch == "on" and not self.inference_mode:
                    # ``with torch.enable_grad():`` inside a ``no_grad`` block.
                    self.no_grad = False
                if item.asname is not None:
                    self.assign(item.asname.name, Unknown(code(item.item), ("context",)), item)
            reference = any(
                roles.gives_the_reference(item.item)
                or self.returns_a_reference_context(item.item)
                or by_generator
                for item, (_, by_generator) in zip(statement.items, entered)
            )
            outer, self.on_reference = self.on_reference, self.on_reference or reference
            done = self.exec_block(statement.body.body)
            self.no_grad, self.inference_mode = saved
            self.on_reference = outer
            if reference:
                for name in _assigned_names(statement.body, unpacked=True):
                    if name in self.env:
                        self.env[name] = roles.as_reference(name, self.env[name])
            return done
        if isinstance(statement, cst.Try):
            env, returns, missing = dict(self.env), len(self.returns), self.missing_keys
            done = self.exec_block(statement.body.body)
            handler = _key_error_handler(statement) if self.missing_keys > missing else None
            if handler is not None:
                # ``try: return KL_PENALTIES[name]`` with a name the table does
                # not hold, ``except KeyError: return _low_var_kl``: the fallback.
                self.env, self.returns[returns:] = env, []
                done = self.exec_block(handler.body.body)
            if statement.finalbody is not None:
                self.exec_block(statement.finalbody.body.body)
            return done and (handler is not None or not statement.handlers)
        if isinstance(statement, cst.FunctionDef):
            scope = self.scope()
            if self.depth == 0:
                self.context.closures[id(statement)] = scope
            self.env[statement.name.value] = FuncRef(
                statement, self.module, self.cls, closure=scope
            )
            return False
        return False

    def context_taken(self, context: cst.BaseExpression) -> cst.BaseExpression:
        """``torch.no_grad() if cfg.detach_kl else nullcontext()``: the branch
        the settings take, when they say."""
        while isinstance(context, cst.IfExp):
            self.flag_defaults.clear()
            taken = self.truth(context.test)
            if taken is None:
                # ``not args.use_kl_loss``: a feature flag, taken as its default
                # has it (a context is no branch kllint can report on both ways).
                taken = self.flag_defaults.pop(id(context.test), None)
            if taken is None:
                return context
            context = context.body if taken else context.orelse
        return context

    def entered_by_generator(self, context: cst.BaseExpression) -> tuple[str | None, bool]:
        """``with reference_adapter(model):``, a ``@contextmanager`` of the
        file that yields inside ``with model.disable_adapter(), torch.no_grad():``:
        the block runs in what the generator entered. The grad switch it
        enters (``"off"``, ``"inference"``), and whether it gives the reference."""
        if not isinstance(context, cst.Call):
            return None, False
        fn: cst.FunctionDef | None = None
        if isinstance(context.func, cst.Name) and context.func.value in self.module.functions:
            fn = self.module.functions[context.func.value]
        elif (
            isinstance(context.func, cst.Attribute)
            and isinstance(context.func.value, cst.Name)
            and context.func.value.value == "self"
            and self.cls is not None
        ):
            fn = self.cls.methods.get(context.func.attr.value)
        if fn is None or not any(
            (dotted_name(d.decorator) or "").endswith("contextmanager") for d in fn.decorators
        ):
            return None, False
        switch, reference = None, False
        for node in descendants(fn.body):
            if not isinstance(node, cst.With) or not any(
                isinstance(n, cst.Yield) for n in descendants(node.body)
            ):
                continue
            for item in node.items:
                switch = switch or lowering.grad_switch(item.item)
                reference = reference or roles.gives_the_reference(item.item)
        return switch, reference

    def returns_a_reference_context(self, context: cst.BaseExpression) -> bool:
        """``with self.optional_peft_ctx():``, a method of the class that
        returns ``...disable_adapter()`` (TRL's PPO trainer)."""
        if not (
            isinstance(context, cst.Call)
            and isinstance(context.func, cst.Attribute)
            and isinstance(context.func.value, cst.Name)
            and context.func.value.value == "self"
            and self.cls is not None
        ):
            return False
        method = self.cls.methods.get(context.func.attr.value)
        return method is not None and any(
            isinstance(node, cst.Return)
            and node.value is not None
            and any(
                isinstance(n, cst.Name) and n.value in roles.REFERENCE_CONTEXTS
                for n in descendants(node.value)
            )
            for node in descendants(method)
        )

    def exec_loop(self, statement: cst.For | cst.While) -> None:
        """A loop body runs once. A loop over time (``for t in
        reversed(range(T))``) that updates a variable from its own previous
        value (``lastgaelam = delta + gamma * lam * lastgaelam``, ``ret = r +
        gamma * ret``) is a scan: the variable becomes the cumulative sum of
        what is added at each step, reversed for a backward loop. That is how
        per-token KL rewards reach advantages through GAE and returns loops.
        A discount (``ret = r + gamma * ret``) is kept on the scan."""
        direction = _time_loop_direction(statement)
        rows = None if direction is not None or self.unrolling else self.terms_to_unroll(statement)
        if rows is not None:
            self.unrolling = True
            try:
                for row in rows:
                    self.assign(statement.target, row, statement)  # type: ignore[union-attr]
                    self.exec_block(statement.body.body)
            finally:
                self.unrolling = False
            if statement.orelse is not None:
                self.exec_block(statement.orelse.body.body)
            return
        if (
            direction == "forward"
            and isinstance(statement, cst.For)
            and isinstance(statement.iter, cst.Call)
            and len(statement.iter.args) == 3
            and isinstance(statement.target, cst.Name)
        ):
            # ``for s in range(0, n, micro_batch)``: an offset into the batch,
            # a number without gradient (``loss * (e - s) / n`` scales a loss).
            self.assign(
                statement.target, ir.Atom(Role.COEFFICIENT, statement.target.value), statement
            )
        elif isinstance(statement, cst.For):
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
        # The nodes ``scans`` is keyed by, kept alive while it is used: a
        # step replaced in the environment by its scan would be freed, and
        # its id reused by the next carried value's nodes (one running sum
        # then read as another's).
        keyed: list[ir.Node] = []
        reverse = direction == "reverse"
        index = (
            statement.target.value
            if isinstance(statement, cst.For) and isinstance(statement.target, cst.Name)
            else None
        )

        def scanned(step: Value, placeholder: ir.Node) -> Value | None:
            """The scan of a recurrence, per alternative when a branch in the
            body (``next_value = values[:, t + 1] if ... else 0``) split it."""
            if isinstance(step, Choice):
                options = [(label, scanned(v, placeholder)) for label, v in step.options]
                if all(v is None for _, v in options):
                    return None
                carried_on = [v for _, v in options if v is not None]
                if index is not None and all(
                    re.search(rf"\b{re.escape(index)}\b", label) for label, _ in step.options
                ):
                    # ``G[:, t + 1] if t + 1 < T else 0.0``: the last step starts
                    # the recurrence; it is not another way to compute it.
                    return carried_on[0]
                return choice(
                    [
                        (label, v if v is not None else original)
                        for (label, v), (_, original) in zip(options, step.options)
                    ]
                )
            if isinstance(step, ir.Node) and ir.contains(step, placeholder):
                added = ir.substitute(step, {id(placeholder): ir.Const(0.0)})
                discount = _discount_of(step, placeholder)
                scan = ir.CumSum(added, reverse=reverse, discount=discount, origin=step.origin)
                # The carried value is the scan at the next step: what a step
                # stores before it is updated again (``returns[:, t] = ret``,
                # then ``ret = ret * mask[:, t]``) holds this step's term once.
                scans.setdefault(id(placeholder), _next_step(scan, added, discount))
                scans[id(step)] = scan  # what was appended each step is the scan itself
                keyed.extend((placeholder, step))
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

    def dispatched(self, ref: FuncRef, call: cst.Call) -> bool:
        """``LOSSES[name](batch, cfg)``: a function of this file reached only
        through a registry (a dict of terms, a decorator's table), never
        called by its name: the dispatch is where it is called from. (A
        table of lambdas is a table of estimators, judged at the dispatch.)"""
        if _remote_call_of(call, ref.name):
            # ``self.shaper.shape.remote(...)``, a Ray actor's method called
            # from one place: there.
            return (
                not self.context.calls_anywhere(ref.name)
                and self.module.source.count(f"{ref.name}.remote(") == 1
            )
        called = (
            call.func.value
            if isinstance(call.func, cst.Name)
            else call.func.attr.value
            if isinstance(call.func, cst.Attribute)
            else None
        )
        if (
            called is not None
            and called != ref.name
            and ref.name != "lambda"
            and self.context.calls[called] == 1
            and not self.context.calls_anywhere(ref.name)
        ):
            # ``kl_fn = getattr(importlib.import_module(mod), name)``, then
            # ``kl_fn(batch)`` once: the function loaded by name is called there.
            return True
        return (
            isinstance(call.func, cst.Subscript)
            and ref.name != "lambda"  # a lambda is made a function named so
            and not self.context.calls_anywhere(ref.name)
        )

    def terms_to_unroll(self, statement: cst.For | cst.While) -> list[Value] | None:
        """The few items of a list or dict the code wrote itself (loss terms,
        penalties, their names or weights: ``for name, value in
        terms.items()``), each of which the body runs for, so that a total
        built in the loop holds every term. None for any other loop (rows of
        a batch, steps of time), whose body runs once."""
        if not isinstance(statement, cst.For):
            return None
        iterable = statement.iter
        method = None
        if (
            isinstance(iterable, cst.Call)
            and not iterable.args
            and isinstance(iterable.func, cst.Attribute)
            and iterable.func.attr.value in ("items", "values", "keys")
        ):
            method, iterable = iterable.func.attr.value, iterable.func.value
        if isinstance(iterable, cst.Call) and method is None and _may_be_a_generator(iterable):
            value = self.eval(iterable)
            if isinstance(value, Seq) and value.generated and len(value.items) > 1:
                return value.items
            # Taken by the loop's target below, not called a second time.
            self.iterated[id(iterable)] = value
            return None
        if not isinstance(iterable, (cst.Name, cst.Attribute, cst.List, cst.Tuple)):
            return None
        value = self.eval(iterable)
        rows: list[Value]
        if isinstance(value, DictVal) and not value.positional:
            keys: list[Value] = [Py(shown_key(k)) for k in value.items]
            if method == "items":
                rows = [Seq([k, v]) for k, v in zip(keys, value.items.values())]
            else:
                rows = list(value.items.values()) if method == "values" else keys
            held = list(value.items.values())
        elif isinstance(value, Seq) and method is None:
            rows = held = value.items
        else:
            return None
        if not 2 <= len(rows) <= _UNROLLED_TERMS:
            return None
        names_only = all(isinstance(v, Py) and isinstance(v.value, str) for v in held)
        return rows if names_only or any(map(roles.may_carry_kl, held)) else None

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
        pieces = split_tensor(iterable)
        if pieces is not None and isinstance(target, cst.Name) and splits_by_length(iterable):
            self.assign(target, self.eval(pieces), node)
            self.sequence_rows.add(target.value)
            return
        if (
            isinstance(iterable, cst.Name)
            and iterable.value in self.sequence_splits
            and isinstance(target, cst.Name)
        ):
            self.assign(target, self.sequence_splits[iterable.value], node)
            self.sequence_rows.add(target.value)
            return
        value = (
            self.iterated.pop(id(iterable))
            if id(iterable) in self.iterated
            else self.eval(pieces if pieces is not None else iterable)
        )
        lists = (
            [v for _, v in value.options if isinstance(v, Seq) and v.items]
            if isinstance(value, Choice)
            else []
        )
        if isinstance(value, Choice) and len(lists) == len(value.options):
            # A list built on either branch (per-sample KLs, or zeros when
            # the coefficient is 0): a row of whichever it is.
            value = Choice([(label, v.items[0]) for (label, _), v in zip(value.options, lists)])
        if isinstance(value, (ir.Node, Choice)) and not isinstance(value, ir.Opaque):
            self.assign(target, value, node)
        elif isinstance(value, Seq) and value.items and isinstance(target, cst.Name):
            self.assign(target, value.items[0], node)
            if value.sequences:
                # ``for lp in unpack(packed, lengths)``: one response's tokens.
                self.sequence_rows.add(target.value)
        elif (
            isinstance(value, Unknown)
            and value.names
            and (
                roles.weight_role(value.names[-1]) is Role.MASK
                or roles.is_logprob_name(value.names[-1])
            )
        ):
            # Each sample's loss mask is a mask; each sample's log-probs
            # (``for rlp in rollout["ref_log_probs"]``) that policy's log-probs.
            self.assign(target, value, node)
        elif isinstance(value, Seq) and value.items and isinstance(target, (cst.Tuple, cst.List)):
            self.assign(target, value.items[0], node)  # ``for lp, mb in outs``: one row
        elif isinstance(value, Unknown) and pieces is not None:
            # ``for c in logits.split(k, dim=1)``: a piece of a tensor is what
            # the tensor is (the teacher's logits, cut into chunks).
            self.assign(target, value, node)
        elif isinstance(value, Unknown):
            # ``for mb in micro_batches``: a row of rows kllint does not hold,
            # the same container in every loop over them. What a data loader
            # yields (``for ids, mask, lp, adv in DataLoader(buffer)``) is data,
            # stored log-probs included, whatever its variables are called.
            row = Unknown(
                code(iterable),
                ("loop",),
                same_as=value.same_as or value,
                stored=_loads_data(iterable),
            )
            self.assign(target, row, node)
        else:
            self.assign(
                target, Unknown(code(iterable), ("loop",), stored=_loads_data(iterable)), node
            )

    def exec_if(self, statement: cst.If) -> bool:
        orelse = statement.orelse
        else_body: Sequence[cst.CSTNode] = []
        if isinstance(orelse, cst.Else):
            else_body = orelse.body.body
        elif isinstance(orelse, cst.If):
            else_body = [orelse]
        self.flag_defaults.clear()
        truth = self.truth(statement.test)
        test = self.deciding(statement.test) if truth is None else statement.test
        flag = self.flag_defaults.pop(id(test), None)
        # ``if args.use_legacy_kl: ... else: ...`` with the flag's default in the
        # settings: two implementations of one KL. Both stay open; a finding
        # only on the one the defaults do not run is dropped where the one
        # they run is right (see the driver). A flag that turns a term on
        # (``if use_kl_loss:``, with no else or ``kl_loss = zeros(())``) is not one.
        alternatives = flag is not None and (
            _both_read_the_reference(statement.body.body, else_body)
            or (not else_body and self.revises_a_kl(statement.body.body))
        )

        def label() -> str:
            condition = self.condition_label(test)
            if flag is not None:
                note_default(condition, flag)
            if alternatives:
                note_alternatives(condition)
            return condition

        return self.exec_branch(
            truth,
            label,
            lambda: self.exec_block(statement.body.body),
            lambda: self.exec_block(else_body),
        )

    def deciding(self, test: cst.BaseExpression) -> cst.BaseExpression:
        """What an open condition turns on: ``cfg.use_kl_loss`` of
        ``cfg.use_kl_loss and cfg.kl_loss_level == "trajectory"`` when the
        level's default passes (so that ``elif cfg.use_kl_loss:`` after it
        is read as the flag's other side, which it is by default)."""
        if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
            if self.truth(test.right) is True:
                return self.deciding(test.left)
            if self.truth(test.left) is True:
                return self.deciding(test.right)
        return test

    def revises_a_kl(self, block: Sequence[cst.CSTNode]) -> bool:
        """``if kl.future_credit: per_pos_kl = per_pos_kl + later_kl * score``:
        a flag that revises a KL term the code already holds, rather than
        turning one on; without it the term is still there, another
        implementation of the same KL."""
        return any(
            sinks.may_hold_kl(self.env[name])
            for name in _assigned_from_itself(block)
            # The KL term itself (``per_pos_kl``), not a loss that holds one
            # among other terms (``loss = loss + beta * kl`` turns a term on).
            if name in self.env and roles.has_words(name, roles.KL_WORDS)
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
        # A dict written by key on a path (``batch["token_level_rewards"] =``,
        # in the branch or by a helper given it) is the same object on both:
        # each path starts from its entries as they were, and they are merged.
        dicts = list({id(v): v for v in saved_env.values() if isinstance(v, DictVal)}.values())
        before = [dict(d.items) for d in dicts]
        self.path = [*saved_path, condition]
        then_done = then_run()
        then_env = self.env
        then_items = [d.items for d in dicts]
        for d, items in zip(dicts, before):
            d.items = dict(items)
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
            for d, items in zip(dicts, then_items):
                d.items = items
        else:
            self.env = merge_envs(then_env, else_env, condition)
            for d, items in zip(dicts, then_items):
                d.items = merge_envs(items, d.items, condition)
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
            return compare(cst.Equal(), subject, self.eval(pattern.value))
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

    def pieces(self, assignment: cst.Assign) -> Seq | None:
        """``chunks = torch.split(x, response_lengths)``: pieces, each what
        ``x`` is, for the loops over them (``zip(chunks, loss_masks)``).
        Unpacked (``chosen, rejected = x.chunk(2)``) the pieces are different
        rows, which one value cannot stand for: None, as for what is no tensor.
        ``list(torch.split(...))`` holds the same pieces."""
        value = assignment.value
        if (
            isinstance(value, cst.Call)
            and isinstance(value.func, cst.Name)
            and value.func.value in ("list", "tuple")
            and len(value.args) == 1
        ):
            value = value.args[0].value
        cut = split_tensor(value)
        if cut is None or not all(isinstance(t.target, cst.Name) for t in assignment.targets):
            return None
        whole = self.eval(cut)
        if isinstance(whole, (ir.Node, Choice)) and not isinstance(whole, ir.Opaque):
            return Seq([whole], appended=True)
        return None

    def exec_small(self, small: cst.BaseSmallStatement) -> bool:
        if isinstance(small, cst.Assign):
            value = self.pieces(small) or self.eval(small.value)
            for target in small.targets:
                self.assign(target.target, value, small)
        elif isinstance(small, cst.AnnAssign) and small.value is not None:
            self.assign(small.target, self.eval(small.value), small)
        elif isinstance(small, cst.AugAssign):
            op = BINOPS.get(type(small.operator).__name__.replace("Assign", ""))
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
            if self.depth == 0 and isinstance(small.value, cst.Call):
                self.store_into_a_buffer(small.value)
        elif isinstance(small, cst.Return):
            value = self.eval(small.value) if small.value is not None else Py(None)
            # ``return kl`` of a name keeps what the name holds: a term computed
            # under ``enable_grad`` inside a ``no_grad`` method keeps its graph.
            if (
                self.no_grad
                and not isinstance(small.value, cst.Name)
                and isinstance(value, (ir.Node, Choice, Flipped, Grouped))
            ):
                value = self.lift1(value, ir.detach)
            self.returns.append((AND.join(self.path), value))
            if self.loss_function and self.depth == 0:
                self.loss_sink_from_return(small, value)
            elif self.depth == 0 and (
                sinks.is_advantage_function(self.function_name)
                or (
                    # ``return returns`` from a reward shaper nothing in this
                    # file calls (or what ``compute_returns`` returns): what a
                    # policy-gradient loss elsewhere reads.
                    (
                        sinks.is_returns_function(self.function_name)
                        or (
                            isinstance(small.value, cst.Name)
                            and (
                                sinks.is_advantage_key(small.value.value)
                                or sinks.is_returns_key(small.value.value)
                            )
                        )
                        # ``return cumulative_returns(rewards, mask, gamma)``
                        or (
                            isinstance(small.value, cst.Call)
                            and sinks.gives_returns(dotted_name(small.value.func) or "")
                        )
                    )
                    and not self.context.calls_anywhere(self.function_name)
                )
            ):
                for item in _advantages_of(small.value, value):
                    self.advantage_sink(
                        small, item, f"the advantages returned by `{self.function_name}`"
                    )
            elif self.depth == 0 and sinks.may_hold_kl(value):
                self.caller_sink_from_return(small, value)
                added = _loss_added_to(small.value)
                if added is not None:
                    # ``return pg_loss + self.kl_coef * kl``: what is added to a
                    # loss and returned with it is that loss too.
                    shown = f"the value returned by `{self.function_name}` (`{added}` plus more)"
                    self.add_sink(value, shown, False, small)
            record = small.value
            if isinstance(record, (cst.ListComp, cst.GeneratorExp)):
                # ``return [PPORLElement(..., rewards=returns[i]) for i in ...]``:
                # one record per sample, each holding its row.
                record = record.elt
            if self.depth == 0 and isinstance(record, cst.Call):
                for shown, field_value in self.record_advantages(record):
                    self.advantage_sink(small, field_value, f"the advantages stored as `{shown}`")
            records = (
                [value]
                if isinstance(value, DictVal)
                else [v for v in value.items if isinstance(v, DictVal)]
                if isinstance(value, Seq) and isinstance(small.value, cst.Tuple)
                else []
            )
            for returned in records if self.depth == 0 else []:
                # ``return {"advantages": advantages, ...}``: an experience
                # record as a dict, read back by the loss (also beside the
                # metrics, ``return experience, info``).
                for key, item in _read_back(list(returned.items.items())):
                    self.advantage_sink(small, item, f"the advantages returned as `{key}`")
            if (
                self.depth == 0
                and isinstance(small.value, cst.Tuple)
                and isinstance(value, Seq)
                and len(value.items) == len(small.value.elements)
                and not self.context.calls.get(self.function_name)
            ):
                # ``return logprobs, advantages`` from a rollout scorer nothing in
                # this file calls: the advantages a loss elsewhere reads back
                # (the returns, when no advantages are returned beside them).
                for _, item in _read_back(_named_elements(small.value, value)):
                    self.advantage_sink(
                        small, item, f"the advantages returned by `{self.function_name}`"
                    )
            return True
        elif isinstance(small, cst.Raise):
            return True
        elif isinstance(small, cst.ImportFrom):
            # ``from .pipeline import compute_rewards`` inside a function (to
            # avoid an import cycle): the name is the project's, as at top level.
            # ``from .kl import ESTIMATORS``: a table or a setting of the
            # project, read as its import at the top of the file is.
            for local, imported in names_imported(small):
                self.env[local] = self.imported(local, imported)
        return False

    def loss_sink_from_return(self, node: cst.Return, value: Value) -> None:
        returned = sinks.returned_losses(self.function_name, node.value, value)
        used = sinks.backpropagated_elements(
            self.context.project, self.module.path, self.function_name, value
        )
        if used is not None:
            # ``return pg_loss, clipfrac, kl``: what the callers add to the loss.
            elements, caller = used
            returned += [
                (item, description)
                for item, description in sinks.returned_losses(
                    self.function_name,
                    node.value,
                    value,
                    description=sinks.caller_description(caller, self.function_name),
                    elements=elements,
                )
                if not any(item is seen for seen, _ in returned)
            ]
        for item, description in returned:
            self.add_sink(item, description, True, node)

    def caller_sink_from_return(self, node: cst.Return, value: Value) -> None:
        """A helper whose result a caller in another file backpropagates:
        judged here, where it is written, naming that caller."""
        assert isinstance(self.function_node, cst.FunctionDef)
        caller = sinks.backprop_caller(
            self.context.project,
            self.module.path,
            self.function_node,
            self.cls.name if self.cls is not None else None,
        )
        if caller is None or _per_token_kl(value) or _signed_for_the_caller(value):
            # A per-token estimate: how it is reduced, and so whether it is
            # a bug, is the caller's; its call is the line the rule book names.
            # So is a KL returned with the penalty's sign alone (``-coef *
            # kl``, a term of an objective): whether it is minimised or
            # maximised is the caller's.
            return
        description = sinks.caller_description(caller, self.function_name)
        # ``SequenceKLObjective.forward``, backpropagated as ``loss = -objective``:
        # a value written to be maximised is minimised as its negation.
        maximised = sinks.names_an_objective(self.function_name) or (
            self.cls is not None and sinks.names_an_objective(self.cls.name)
        )
        for item, shown in sinks.returned_losses(
            self.function_name, node.value, value, description=description, elements=caller.elements
        ):
            if maximised:
                item, shown = self.lift1(item, ir.neg), f"{shown}, negated (an objective)"
            self.add_sink(item, shown, True, node)

    def record_advantages(self, call: cst.Call) -> list[tuple[str, Value]]:
        """``return Experience(sequences, ..., returns, kl)``: a record of a
        class of the project whose advantage or return field a loss in
        another call tree reads back."""
        if not isinstance(call.func, cst.Name) or not call.func.value[:1].isupper():
            return []
        found = self.context.project.class_named(call.func.value, self.module)
        if found is None:
            # A record class of a framework (``openrlhf``'s ``Experience``):
            # its fields are not read here, but an argument named for what it
            # holds (``advantages``) is that field.
            named = [
                (name, arg)
                for arg in call.args
                if arg.star == ""
                for name in (
                    arg.keyword.value if arg.keyword is not None else "",
                    _held_name(arg.value),
                )
            ]
            found_fields = [
                (f"{call.func.value}.{field}", arg)
                for field, arg in named
                if sinks.is_advantage_field(field)
            ]
            unique = {id(arg): (shown, arg) for shown, arg in found_fields}
            return [(shown, self.eval(arg.value)) for shown, arg in unique.values()]
        fields = _record_fields(found[0])
        given = [
            (fields[position] if position < len(fields) else "", arg)
            for position, arg in enumerate(a for a in call.args if a.keyword is None)
        ]
        given += [(a.keyword.value, a) for a in call.args if a.keyword is not None]
        return [
            (f"{found[0].name}.{field}", self.eval(arg.value))
            for field, arg in given
            if arg.star == "" and sinks.is_advantage_field(field)
        ]

    def advantage_sink(
        self, node: cst.CSTNode, value: Value, description: str, *, rewards: bool = False
    ) -> None:
        """Advantages that carry a KL, returned or stored to be read by the
        loss of another call tree: judged as the policy-gradient surrogate
        ``-advantages * logp`` that loss computes with them. Per-token
        ``rewards`` stored the same way are judged as credited by their
        reward-to-go (GAE with gamma = lambda = 1, or returns), as PPO and
        REINFORCE++ credit them; only what holds under that credit is claimed."""
        options = _rows(value)
        if not options or any(
            sink.function_node is self.function_node and not sink.read_elsewhere
            for sink in self.context.sinks
        ):
            return  # a training step that backpropagates itself is judged by its own loss
        if not any(
            isinstance(v, ir.Node)
            and v.has_role(Role.REFERENCE_LOGP)
            and not ir.depends_on_policy(v)
            for _, v in options
        ):
            return
        origin = ir.Origin(
            self.context.path,
            cst_node=node,
            statement=self.statement,
            function=self.root,
            assumed=(
                "the rewards are credited by their reward-to-go in a "
                "policy-gradient loss that reads them back"
                if rewards
                else "the advantages weight the policy's log-probs in a "
                "policy-gradient loss that reads them back"
            ),
        )
        read_by = "the rewards" if rewards else "the advantages"
        policy = ir.Atom(Role.POLICY_LOGP, f"logp (in the loss reading {read_by})")

        def credited(a: ir.Node) -> ir.Node:
            return ir.CumSum(a, reverse=True, origin=origin) if rewards else a

        def surrogate(a: ir.Node) -> ir.Node:
            return ir.policy_gradient(credited(a), policy, origin)

        # Each path keeps its condition, also a lone one (the KL reward behind
        # ``if kl_placement == "reward"``, the other path's rewards unread).
        paths: list[tuple[str, Value]] = [
            (label, surrogate(a)) for label, a in options if isinstance(a, ir.Node)
        ]
        self.add_sink(
            paths[0][1] if len(paths) == 1 and not paths[0][0] else Choice(paths),
            description,
            True,
            node,
            read_elsewhere=True,
        )

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
                    owner=self.self_class[0].name if self.self_class else None,
                    read_elsewhere=read_elsewhere,
                )
            )
        elif backward and self.entry_call is not None:
            # ``self.train_minibatch(batch)`` from the training loop: the
            # backward pass inside the helper sees the caller's values (KL
            # rewards computed in another method), so it is a sink too, placed
            # at the call.
            self.context.sinks.append(
                Sink(
                    value,
                    f"{description} in {self.entry_call.helper}",
                    strong,
                    self.entry_call.cst_node,  # type: ignore[arg-type]
                    self.function_name,
                    self.entry_root,
                    backward,
                    inlined_call=self.entry_call.cst_node,  # type: ignore[arg-type]
                    inlined_backward=node,
                    owner=self.self_class[0].name if self.self_class else None,
                )
            )

    def store_into_a_buffer(self, call: cst.Call) -> None:
        """``buffer.add(list(zip(ids, returns, mask)))``: returns or advantages
        kept in a replay buffer (a queue, a list of rollouts) for a loss that
        samples them later, as if stored under their name."""
        func = call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value in sinks.STORE_METHODS):
            return
        for arg in call.args:
            for name in _names_in(arg.value):
                value = self.env.get(name)
                if value is None or not sinks.may_hold_kl(value):
                    continue
                shown = f"{code(func.value)}.{func.attr.value}(...)"
                if sinks.is_advantage_key(name):
                    self.stored_advantages.append((call, shown, value))
                elif sinks.is_returns_key(name):
                    self.stored_returns.append((call, shown, value))
                elif sinks.is_rewards_key(name) and self.depth == 0:
                    # ``self.history.append(PPORLElement(..., rewards[i]))``:
                    # per-token rewards kept for a loss that credits them later.
                    self.stored_rewards.append((call, shown, value))

    def assign(self, target: cst.BaseExpression, value: Value, node: cst.CSTNode) -> None:
        if self.no_grad and isinstance(value, (ir.Node, Choice, Flipped, Grouped)):
            # Whatever is computed under no_grad/inference_mode has no gradient,
            # including arithmetic on tensors that had one.
            value = self.lift1(value, ir.detach)
        stored = sinks.stored_advantages(target)
        if stored is not None and self.depth == 0:
            self.stored_advantages.append((node, stored, value))
        rewarded = sinks.stored_rewards(target) if stored is None else None
        if rewarded is not None and self.depth == 0:
            self.stored_rewards.append((node, rewarded, value))
        elif rewarded is not None and self.module is self.context.module:
            self.helper_rewards.append((node, rewarded, value))
        returned = sinks.stored_returns(target) if self.depth == 0 else None
        if returned is not None:
            self.stored_returns.append((node, returned, value))
        if isinstance(target, cst.Name):
            self.assign_name(target.value, value, node)
        elif isinstance(target, (cst.Tuple, cst.List)):
            self.assign_unpacked(target, value, node)
        elif (
            isinstance(target, cst.Attribute)
            and isinstance(target.value, cst.Name)
            and target.value.value == "self"
            and isinstance(self.env.get("self"), Unknown)
        ):
            # ``self.kl = ...`` on an object kllint does not hold: read back
            # by this function (``rewards = -self.kl_coef * self.kl``).
            self.env[written_attribute("self", target.attr.value)] = value
        elif (
            isinstance(target, cst.Attribute)
            and isinstance(target.value, cst.Name)
            and isinstance(self.env.get(target.value.value), Unknown)
            and sinks.may_hold_kl(value)
        ):
            # ``experience.returns = get_cumulative_returns(reward, ...)`` on a
            # record kllint does not hold: read back by this function
            # (``experience.advantages = experience.returns.clone()``).
            self.env[written_attribute(target.value.value, target.attr.value)] = value
        elif (
            isinstance(target, cst.Attribute)
            and isinstance(target.value, cst.Name)
            and isinstance(self.env.get(target.value.value), Instance)
        ):
            # ``self.kind = kind`` in the ``__init__`` of an object being built.
            self.env[target.value.value].attrs[target.attr.value] = value  # type: ignore[union-attr]
        elif (
            isinstance(target, cst.Subscript)
            and isinstance(target.value, cst.Attribute)
            and isinstance(target.value.value, cst.Name)
            and isinstance(self.env.get(target.value.value.value), Instance)
            and string_key(target) is not None
        ):
            # ``self.losses["kl"] = KLPenalty(...)``: an entry added to a dict
            # (an ``nn.ModuleDict``) the object holds.
            held = self.env[target.value.value.value]
            assert isinstance(held, Instance)
            entries = held.attrs.get(target.value.attr.value)
            if isinstance(entries, DictVal):
                entries.items[string_key(target)] = value  # type: ignore[index]
        elif isinstance(target, cst.Subscript) and isinstance(target.value, cst.Name):
            container = self.env.get(target.value.value)
            key = string_key(target)
            if key is not None and isinstance(value, Unknown):
                # ``mb["ref_tok"] = token_logprobs(ref_model, mb)``: the key
                # names what is stored, as a variable's name would.
                value = self.resolve(
                    replace(value, names=(*value.names, key)), key, keep_unknown=True
                )
            if (
                key is None
                and isinstance(container, (ir.Node, Unknown))
                and isinstance(value, (ir.Node, Choice))
                and sinks.may_hold_kl(value)
            ):
                # ``returns[:, t] = running`` in a reward-to-go loop: the buffer
                # holds what was written into it, a KL penalty included.
                self.env[target.value.value] = value
            elif (
                key is None
                and isinstance(container, Seq)
                and container.gathered
                and isinstance(value, (ir.Node, Choice))
            ):
                # ``chunks[rank] = local`` after ``dist.all_gather(chunks, local)``:
                # this rank's slot holds its tensor again, with its graph.
                self.env[target.value.value] = Seq([value], appended=True)
            elif (
                key is None
                and isinstance(container, ir.Node)
                and (ir.is_new_constant_tensor(container) or isinstance(container, ir.Const))
                and isinstance(value, (ir.Node, Choice))
                and roles.may_carry_kl(value)
            ):
                # ``out = x.new_zeros(B * T); out[indices] = log_probs_rmpad``:
                # a packed batch padded back holds its values, without their
                # graph when written under no_grad.
                written = self.lift1(value, ir.detach) if self.no_grad else value
                self.env[target.value.value] = written
            elif (
                isinstance(container, ir.Node)
                and isinstance(value, ir.Const)
                and sinks.may_hold_kl(container)
            ):
                # ``rewards[i, ends[i]:] = 0``: the padding after each response
                # zeroed, as a response mask would; the KL penalty on the
                # response stays.
                name = target.value.value
                zeroed = ir.Atom(Role.MASK, f"{name} (padding zeroed)")
                self.env[name] = self.lift1(container, lambda n: ir.binary("mul", n, zeroed))
            elif isinstance(container, (ir.Node, Seq)):
                # ``buffer[:, i] = ...`` fills a tensor in place: it is no longer
                # what it was; filled under no_grad, it has no gradient.
                self.env[target.value.value] = Unknown(
                    target.value.value, (target.value.value,), detached=self.no_grad
                )
            elif isinstance(container, Unknown) and self.no_grad and key is None:
                # ``logps = torch.zeros(...)`` filled row by row under no_grad
                # (a dict given an entry, ``batch["ref_logps"] = ...``, is not).
                self.env[target.value.value] = replace(container, detached=True)
            if (
                isinstance(container, Unknown)
                and key is not None
                and (sinks.may_hold_kl(value) or sinks.carries_the_policys_gradient(value))
            ):
                # Also the policy's log-probs with their gradient
                # (``mb["log_prob"] = log_prob`` before ``compute_loss(mb)``): a
                # loss reading them back would otherwise take them for stored.
                self.context.write(container, key, value)
            if (
                self.on_reference
                and isinstance(container, Unknown)
                and key is not None
                and roles.is_one_log_prob(value)
            ):
                # ``inputs["prev_logps"] = logps(self.model, ...)`` under
                # ``disable_adapter()``: the reference's log-probs, for every
                # function of the file that reads the entry back.
                reference = roles.as_reference(key, value)
                self.context.write(container, key, reference)
                self.context.shared_entries[key] = reference
            if isinstance(container, DictVal) and key is not None:
                container.items[key] = value
                if sinks.is_loss_name(key):
                    self.add_sink(value, f"the loss entry `{key}`", False, node)
        elif (
            isinstance(target, cst.Subscript)
            and isinstance(target.value, cst.Attribute)
            and (sinks.may_hold_kl(value) or sinks.carries_the_policys_gradient(value))
        ):
            # ``data.batch["token_level_rewards"] = scores - beta * kld`` in
            # verl's ``apply_kl_penalty``: the caller reads it back from its
            # own name for the batch. So are the policy's log-probs
            # (``mb.batch["log_prob"] = ...`` before ``self._kl_loss(mb)``).
            key = string_key(target)
            container = self.eval(target.value)
            if key is not None and isinstance(container, Unknown):
                self.context.write(container, key, value)
            elif key is not None and isinstance(container, DictVal):
                # ``out.metrics["kl"] = kl_value``: an entry of a dict a record holds.
                container.items[key] = value

    def assign_name(self, name: str, value: Value, node: cst.CSTNode) -> None:
        """``name = value``: the name is evidence of what the value is."""
        # ``lr = lp - ref`` of two responses' rows: one response's tokens too.
        of_rows = isinstance(node, cst.Assign) and self.of_sequence_rows(node.value)
        self.sequence_rows.discard(name)
        if of_rows:
            self.sequence_rows.add(name)
        self.sequence_splits.pop(name, None)
        if (
            isinstance(node, cst.Assign)
            and split_tensor(node.value) is not None
            and splits_by_length(node.value)
        ):
            # Each piece is what the tensor cut apart is.
            self.sequence_splits[name] = (
                value.items[0] if isinstance(value, Seq) and value.items else value
            )
        patterns = self.context.role_patterns
        # ``logp_chunks = []``: a list to be filled, not yet a log-prob.
        to_fill = isinstance(value, Seq) and not value.items
        if (
            # ``get_lp = functools.partial(token_logps, ...)`` names a function.
            not isinstance(value, (Unknown, FuncRef, Instance))
            and not to_fill
            and (
                patterns.logprob_role(name) is not None
                or (patterns.role_from_words(name) is not None and roles.is_one_log_prob(value))
            )
        ):
            value = roles.name_logprob(name, value, patterns, no_grad=self.no_grad)
        elif roles.is_one_probability(value):
            # ``ref_tok = token_probs(ref_model, ...)``: the caller's name.
            value = roles.reference_renamed(name, value, patterns) or value
        if (
            isinstance(value, Unknown)
            and self.no_grad
            and (roles.names_logits(name) or any(roles.names_logits(n) for n in value.names[-1:]))
        ):
            # ``with torch.no_grad(): student_logits = model(ids).logits``: the
            # log-probs formed from them later have no gradient either.
            value = replace(value, detached=True)
        if isinstance(value, Unknown):
            # The variable's own name is evidence too (``mask``, ``beta``); as
            # a container it is the value it names.
            read = value
            value = replace(value, names=(*value.names, name), same_as=value.same_as or value)
            value = self.resolve(value, name, keep_unknown=True)
            self.entry_named(read, value)
        elif isinstance(value, Choice):
            value = Choice(
                [
                    (
                        label,
                        self.resolve(v, name, keep_unknown=True) if isinstance(v, Unknown) else v,
                    )
                    for label, v in value.options
                ]
            )
        self.env[name] = value
        if sinks.is_loss_name(name):
            self.add_sink(value, f"the loss variable `{name}`", False, node)

    def entry_named(self, read: Unknown, named: Value) -> None:
        """``old_log_probs = batch["log_probs"]``: the code says what the
        entry holds (the rollout's log-probs, the ratio's denominator), and
        every later read of it (``compute_kl(batch["log_probs"], ref)``)
        is that, whatever its key alone would suggest."""
        if not (
            isinstance(named, ir.Node)
            and {a.role for a in named.atoms()} == {Role.OLD_LOGP}
            and read.text.endswith("]")
            and read.text.count("[") == 1
        ):
            return
        holder = read.text.partition("[")[0]
        container = self.env.get(holder) if holder.isidentifier() else None
        if isinstance(container, Unknown):
            self.context.write(container, read.names[-1], named)

    def assign_unpacked(
        self, target: cst.Tuple | cst.List, value: Value, node: cst.CSTNode
    ) -> None:
        """``a, b = value``."""
        elements = [e.value for e in target.elements]
        # ``policy, ref_policy = get_policy_and_ref(...)``: where the code names
        # one element as the reference, the others are not, whatever the call is named.
        named_reference = isinstance(value, Unknown) and any(
            isinstance(e, cst.Name) and roles.has_words(e.value, roles.REFERENCE_WORDS)
            for e in elements
        )
        for i, element in enumerate(elements):
            item = _unpacked(value, i)
            if item is None:
                item = Unknown(code(element), ("unpacked",))
            elif (
                named_reference
                and isinstance(item, Unknown)
                and isinstance(element, cst.Name)
                and not roles.reference_evidence(element.value)
            ):
                item = replace(item, names=(element.value,), reference_model=False)
            self.assign(element, item, node)

    def inline(
        self,
        ref: FuncRef,
        call: cst.Call,
        evaluated: Sequence[Value] | None = None,
        arguments: Sequence[cst.Arg] | None = None,
    ) -> Value:
        """Interpret ``ref`` with the call's arguments bound (``evaluated``:
        the arguments' values, when the caller already has them;
        ``arguments``: the ones ``ref`` is given, when not all of the call's
        are, as in ``checkpoint(fn, x, use_reentrant=False)``)."""
        given = call.args if arguments is None else arguments
        if self.depth >= MAX_DEPTH:
            return Unknown(code(call), (ref.name,), call=True)
        if not ref.parsed and ref.receiver is None:
            # Decided before LibCST parses the function (it is not on the
            # stack: nothing running is unparsed), on all the call gives it.
            if evaluated is None:
                evaluated = [self.eval(arg.value) for arg in given]
            if not self.may_matter(ref, {}, given=evaluated):
                return Unknown(code(call), (ref.name,), call=True)
        key = id(ref.node)
        if key in self.stack:
            return Unknown(code(call), (ref.name,), call=True)
        bound: dict[str, Value] = {}
        params = ref.node.params
        positional = [*params.posonly_params, *params.params]
        if ref.bound and positional and positional[0].name.value in ("self", "cls"):
            bound[positional[0].name.value] = ref.receiver or Unknown("self", ("self",))
            positional = positional[1:]
        elif ref.cls is not None and positional and positional[0].name.value in ("self", "cls"):
            positional = positional[1:]
        index = 0
        for preset in ref.preset_args:
            if index < len(positional):
                bound[positional[index].name.value] = preset
                index += 1
        bound.update(ref.preset_kwargs)
        unread_splat = False
        extra: list[Value] = []
        for position, arg in enumerate(given):
            value = evaluated[position] if evaluated is not None else self.eval(arg.value)
            if arg.star == "**":
                # ``**self.config.global_batch_info``: the entries kllint can read
                # are bound; the others keep their defaults (normalisers, flags).
                if isinstance(value, DictVal):
                    bound.update(value.items)
                else:
                    unread_splat = True
                continue
            if arg.star == "*":
                if not isinstance(value, Seq) or value.appended:
                    index = len(positional)  # the rest of the positionals are unknown
                    unread_splat = True
                    continue
                for item in value.items:
                    if index < len(positional):
                        bound[positional[index].name.value] = item
                        index += 1
                continue
            if arg.keyword is not None:
                bound[arg.keyword.value] = value
            elif index < len(positional):
                bound[positional[index].name.value] = value
                index += 1
            elif isinstance(params.star_arg, cst.Param):
                # ``def actor_loss(*tensors, ...)``: the positionals past the
                # named ones are its tuple (``actor_loss_terms(*tensors)``).
                extra.append(value)
        if extra and isinstance(params.star_arg, cst.Param):
            bound[params.star_arg.name.value] = Seq(extra)
        if not self.may_matter(ref, bound):
            return Unknown(code(call), (ref.name,), call=True)
        if unread_splat and not any(_log_probs_in(v) for v in bound.values()):
            # Past a splat kllint cannot read, a helper is followed only when it
            # is given log-probs (a KL term on its way to a loss): elsewhere the
            # cost of following it buys nothing.
            return Unknown(code(call), (ref.name,), call=True)
        read = self.property_reads.get(id(call))
        shown = read[1] if read is not None else call
        site = self.call_site or self.origin(shown)
        if self.call_site is None:
            site = ir.Origin(
                self.context.path,
                helper=helper_label(ref),
                cst_node=shown,
                function=self.root,
                helper_node=ref.node,
                reported_by_helper=ref.module.path != self.module.path
                and sinks.is_loss_function(
                    ref.name,
                    ref.cls.name if ref.cls else None,
                    _called_in(ref.module),
                )
                and not _given_a_function(bound),
            )
        # A helper of the linted file called from one place, which no
        # parameter steers (no estimator chosen by the caller): its findings
        # are placed inside it, where the code is written. A helper called
        # from several places may be right at one and wrong at another: its
        # findings are placed at the calls.
        of_this_file = ref.module is self.context.module and self.module is self.context.module
        called_once = (
            _times_read(self.context.module.source, ref.name) == 1
            if read is not None
            else _times_called(self.context.calls, ref, call) == 1
        )
        called_once_here = (
            self.call_site is None and of_this_file and (called_once or self.dispatched(ref, call))
        )
        alone = called_once_here and not sinks.steerable(ref.node)
        # Given only logits, the helper forms the log-probs and the estimate
        # itself; a setting passed on to it (``cfg.kl_mode``, not a literal the
        # call names) leaves the choice to the helper's branch.
        forms_its_own = (
            called_once_here
            and not any(_log_probs_in(v) for v in bound.values())
            # A property of an object that holds log-probs (``kl_term.mse``
            # of a record built from ``batch["old_log_probs"]``) is given them.
            and not (
                read is not None
                and isinstance(ref.receiver, Instance)
                and any(_log_probs_in(v) for v in ref.receiver.built().values())
            )
            and not (
                sinks.steerable(ref.node)
                and (_picks_with_a_literal(call) or not any(map(_logits, bound.values())))
            )
        )
        in_place = (
            self.call_site is None
            and ref.module is self.context.module
            and (
                # A subclass's hook called by the inherited method of a base
                # in another file: the hook is the only place in this file.
                self.module is not self.context.module
                # A reward maker run under ``no_grad`` (its decorator or the
                # caller's block): what it returns is a reward without
                # gradient, whatever the caller passes; its estimator is its own.
                or (
                    alone
                    and (self.no_grad or lowering.decorated_no_grad(ref.node))
                    and _makes_rewards(ref)
                )
                or forms_its_own
            )
        )
        sinks_before = len(self.context.sinks)
        rewards_before = len(self.helper_rewards)
        records = {id(v): (v, dict(v.items)) for v in bound.values() if isinstance(v, DictVal)}
        result = self.run_helper(ref, key, site, bound, in_place)
        if not in_place and self.call_site is None:
            result = _handed_back_at_the_call(result, bound, site)
        if site.reported_by_helper and self.call_site is None and _right_as_returned(result):
            # A loss helper of another file that is right on its own (a
            # sequence k2): what the caller makes of it (``pg_loss - beta *
            # self.sequence_kl_loss(...)``) is the caller's to answer for.
            site.reported_by_helper = False
        called_as = _called_as(ref, call)
        # ``maker.advantages_from(...)``, a method of a parameter's class: the
        # one call of that name in the file, through whatever receiver.
        once_through_any = called_once_here or (
            self.call_site is None
            and of_this_file
            and not self.context.calls[called_as]
            and self.context.calls_through_any(called_as) == 1
        )
        if (
            once_through_any
            and not in_place
            and result is None
            and not sinks.steerable(ref.node)
            and _writes_its_own_defect(records)
        ):
            # ``cb.on_loss(state)``: a helper that returns nothing but writes
            # a loss holding its KL into the dict it is handed
            # (``state["loss"] = state["loss"] - beta * kl``) decides the use
            # itself: its findings are placed inside it, the dict as it was given.
            for record, entries in records.values():
                record.items.clear()
                record.items.update(entries)
            result = self.run_helper(ref, key, site, bound, True)
            in_place = True
        # A loss helper of this file called from one place inside a helper
        # judged at its own call: a defect of its own (a k1 it reduces into a
        # loss, whatever it is given) is still written where it is.
        nested_alone = (
            self.call_site is not None
            and of_this_file
            and called_once
            and not sinks.steerable(ref.node)
        )
        if (
            (once_through_any or nested_alone)
            and not in_place
            and result is not None
            and len(self.context.sinks) == sinks_before
            and (
                (
                    (alone or nested_alone)
                    and _defect_of_its_own(result, _maximised(ref))
                    # A KL returned under the penalty's sign alone: the
                    # caller's sign decides what is minimised, at the call.
                    and not _a_signed_kl_alone(result)
                )
                or (
                    # ``apply_kl_penalty(batch, kl_penalty="low_var_kl")`` picks
                    # the estimator at the call: reported there.
                    once_through_any
                    and not any(
                        isinstance(a.value, (cst.SimpleString, cst.ConcatenatedString))
                        for a in call.args
                    )
                    and (
                        len(self.helper_rewards) > rewards_before
                        or (
                            _made_into_rewards(result)
                            # A KL alone under the penalty's sign (``-0.5 *
                            # seq_lr**2``) is a reward where the helper says so
                            # (``kl_reward``); elsewhere its caller's sign decides.
                            and (_makes_rewards(ref) or not _a_signed_kl_alone(result))
                        )
                        or (_makes_rewards(ref) and _added_to_a_reward(result))
                    )
                )
            )
        ):
            # Given the caller's log-probs (or the estimator's name), a helper
            # that returns a per-token estimate leaves its use (a reward, a
            # loss) to the caller: judged at the call. One that decides the
            # use itself holds the whole term: a loss, an objective, a
            # sequence-level reward it reduces, or rewards, returns or
            # advantages it makes of the estimate. Its findings are placed
            # where it is written (interpreted again, so that what it
            # computes carries its own lines).
            del self.helper_rewards[rewards_before:]
            result = self.run_helper(ref, key, site, bound, True)
        if result is None:
            return Py(None)
        if (
            self.call_site is None
            and not site.reported_by_helper
            and sinks.may_hold_kl(result)
            and not _per_token_kl(result)
            and not _signed_for_the_caller(result)
            and not sinks.is_advantage_function(ref.name)
            and self.context.project.reports_on(ref.module)
            and sinks.backprop_caller(
                self.context.project,
                ref.module.path,
                ref.node,
                ref.cls.name if ref.cls is not None else None,
            )
            is not None
            and _defect_of_its_own(result)
            and not _given_a_function(bound)
        ):
            # A helper some caller backpropagates, which reduces its KL itself,
            # is judged in its own file, naming that caller: one bug, one finding.
            # One right as it is (a sequence k2) leaves the caller's use of it
            # (``policy_loss - coef * kl_loss``) to be judged here.
            site.reported_by_helper = True
        if (
            isinstance(result, Unknown)
            and result.logprob_op
            and not result.distribution
            and roles.is_logprob_name(ref.name)
        ):
            # ``self.token_logps(batch)`` used in place: the log-probs its name
            # says, as if assigned to it (the policy's, unless the name or the
            # model says otherwise).
            result = replace(result, names=(*result.names, ref.name))
        return self.credit_rewards(ref.name, call, result)

    def run_helper(
        self, ref: FuncRef, key: int, site: ir.Origin, bound: dict[str, Value], in_place: bool
    ) -> Value | None:
        """What ``ref`` returns given ``bound``, its findings placed inside it
        (``in_place``) or at the call ``site``."""
        callee = Interpreter(
            self.context,
            ref.module,
            ref.cls,
            depth=self.depth + 1,
            call_site=None if in_place else site,
            stack=(*self.stack, key),
            function_name=ref.name,
            # ``self.hook(...)``: the same ``self``, whichever class it is.
            self_class=self.self_class if ref.bound and ref.receiver is None else None,
        )
        callee.entry_call = self.entry_call or site
        callee.entry_root = self.entry_root
        callee.helper_rewards = self.helper_rewards
        callee.root = ref.node if in_place else self.root
        if ref.closure is not None:
            # A nested function sees its enclosing function's locals; its own
            # assignments stay its own (a copy).
            callee.env = dict(ref.closure())
        # Parameters the caller did not pass take their defaults, evaluated in
        # the callee's module: that is how a keyword default picks a branch.
        result = callee.run_function(ref.node, dict(bound), no_grad=self.no_grad)
        for decorator in reversed(ref.node.decorators):
            if result is None:
                break
            result = self.through_wrapper(decorator, ref.module, result)
        return result

    def through_wrapper(
        self, decorator: cst.Decorator, module: ModuleInfo, result: Value
    ) -> Value | None:
        """What a decorator of the project makes of a function's result: one
        whose wrapper returns an expression of the call it wraps (``@negate``
        returning ``-fn(*args, **kwargs)``, ``.detach()``, a scale) gives that
        expression of the result. Any other decorator leaves it as it is."""
        wrapped = _wrapper_return(decorator, module)
        if wrapped is None:
            return result
        expression, call = wrapped
        held = cst.Name(_WRAPPED_RESULT)
        outer = Interpreter(self.context, module, None, depth=self.depth + 1, stack=self.stack)
        outer.env[_WRAPPED_RESULT] = result
        return outer.eval(expression.deep_replace(call, held))

    def may_matter(
        self, ref: FuncRef, bound: dict[str, Value], given: Sequence[Value] = ()
    ) -> bool:
        """Whether following a call can change a verdict: it is given a
        log-prob (or a callable, or an object that holds one), or the
        function can compute a KL term itself. Most of a trainer (data,
        logging, checkpoints, generation) can do neither; following it
        was most of kllint's time. ``given``: the call's arguments, before
        they are bound to parameters (a splatted dict or list whole)."""
        passed = (*bound.values(), *given)
        if any(
            roles.may_carry_kl(v) for v in (*passed, *ref.preset_args, *ref.preset_kwargs.values())
        ):
            return True
        if any(
            sinks.may_hold_kl(entry)
            for v in passed
            if isinstance(v, Unknown)
            for entry in self.context.entries(v).values()
        ):
            # A batch the caller wrote a KL penalty into (``data["token_level_rewards"]``):
            # what the helper computes from it (advantages) carries the KL.
            return True
        if ref.receiver is not None and any(
            roles.may_carry_kl(v) for v in ref.receiver.built().values()
        ):
            return True
        if any(isinstance(v, Py) and isinstance(v.value, str) and v.source for v in passed):
            # ``_slug(config.kl_type)``: a setting's string, normalised by the
            # helper into the name a dispatch looks up.
            return True
        if _makes_a_function(ref):
            # ``reduce = make_sample_reducer(masks, n)``: the function it
            # returns is given the KL later (``kl_loss = reduce(kl)``).
            return True
        if _loads_by_name(ref):
            # ``resolve_kl_fn(cfg)``: ``getattr(importlib.import_module(...), name)``,
            # the estimator the settings name, loaded at run time.
            return True
        if _builds_a_kl_object(ref):
            # ``SequenceKL.from_rollout(batch)``: an object whose methods or
            # properties compute the KL from what the factory stored in it.
            return True
        return roles.may_compute_kl(ref.module, ref.name, ref.cls, self.context.role_patterns)

    def credit_rewards(self, name: str, call: cst.Call, result: Value) -> Value:
        """A helper named like an advantage estimator (``compute_gae``) whose
        loop kllint cannot follow loses the rewards it was given; model its
        results as their reward-to-go (see ``advantage_estimator``)."""
        credited = self.advantage_estimator(name, call)
        if credited is None:
            return result

        def keep(value: Value) -> bool:
            # What the loop was followed to (a return per setting, too).
            if isinstance(value, Choice):
                return any(keep(option) for _, option in value.options)
            return isinstance(value, ir.Node) and value.has_role(Role.REFERENCE_LOGP)

        if isinstance(result, Seq):
            return Seq([item if keep(item) else credited for item in result.items])
        return result if keep(result) else credited


def _defect_of_its_own(value: Value, maximised: bool = False) -> bool:
    """Whether what a helper returns already reduces its KL over each
    sequence's tokens (a loss, an objective, a sequence-level reward) and,
    minimised as it is (``maximised``: as its name says, an objective), has
    a KL gradient defect of its own (a k1 or k3, a per-token term summed, a
    penalty negated inside it). A correct KL, or one without gradient (the
    caller passed detached log-probs), leaves the defect to the use the
    caller makes of it; so does a per-token estimate, whose use (a reward, a
    loss) is still the caller's to decide."""
    # Loss terms returned together (``{"pg": (1.0, pg_loss), "kl": (beta, kl)}``):
    # the rest of the loss has the policy's gradient where any of them has.
    live = {
        id(node)
        for group in _terms_returned_together(value)
        if any(map(ir.depends_on_policy, group))
        for node in group
    }
    terms = [
        (term, ir.depends_on_policy(node) or id(node) in live)
        for node in tensors_of(value)
        if not ir.is_detached(node)
        for term in sites.kl_terms(ir.neg(node) if maximised else node)
    ]
    if not terms or any(_per_token_reference(term) for term, _ in terms):
        return False
    if (
        not maximised
        and not any(_over_the_batch(node) for node in tensors_of(value))
        and not all(_score_function_term(term) for term, _ in terms)
    ):
        # ``sequence_kl_k3(logp, ref, mask)``: one estimate per sequence,
        # which the caller makes into a loss (or a reward): its call is where
        # the estimate enters, as for a per-token one. A score-function term
        # (``(kl_to_go * logp * mask).sum(-1)``) is a surrogate loss already,
        # per sequence or not: no reward is made of it.
        return False
    for term, with_gradient in terms:
        found = sites.profile_of(term)
        if found is None:
            continue
        if found.direction is not Direction.NONE and not found.sequence_correct:
            return True
        if found.direction is Direction.NONE and with_gradient:
            # A loss with the policy's gradient whose KL term has none: the
            # helper built the estimate from the wrong log-probs itself
            # (``exp(lq - lmu)`` beside ``exp(lp - lmu)``), whatever it is given.
            return True
    return False


def _writes_its_own_defect(records: dict[int, tuple[DictVal, dict[str, Value]]]) -> bool:
    """Whether a helper wrote, into a dict it was given, an entry whose KL
    has a defect of its own (see ``_defect_of_its_own``)."""
    return any(
        value is not before.get(key) and _defect_of_its_own(value)
        for record, before in records.values()
        for key, value in record.items.items()
    )


def _terms_returned_together(value: Value) -> list[list[ir.Node]]:
    """The groups of loss terms a helper returns side by side: the tensors of
    one tuple or dict, each alone or weighted (``(beta, kl_loss)``). A dict
    of metrics returned beside the loss (``loss, log``) is a group of its own."""
    groups: list[list[ir.Node]] = []

    def visit(held: Value) -> None:
        if not isinstance(held, (Seq, DictVal)):
            return
        group: list[ir.Node] = []
        for item in held.items if isinstance(held, Seq) else list(held.items.values()):
            if isinstance(item, ir.Node):
                group.append(item)
            elif isinstance(item, Seq) and not any(
                isinstance(i, (Seq, DictVal)) for i in item.items
            ):
                group.extend(i for i in item.items if isinstance(i, ir.Node))
            else:
                visit(item)
        groups.append(group)

    visit(value)
    return groups


def _score_function_term(term: ir.Node) -> bool:
    """A KL term whose estimate enters only detached, as the weight of the
    policy's log-probs (the score function of the KL)."""
    focus = sites.focus_of(term)
    return ir.depends_on_policy(term) and not ir.reaches(term, lambda n: n is focus, ir.is_detached)


def _over_the_batch(node: ir.Node) -> bool:
    """Whether a value is reduced over the sequences of the batch (a loss),
    not left one value per sequence."""
    return any(
        isinstance(n, ir.Reduce) and n.axis in (ir.Axis.BATCH, ir.Axis.ALL) for n in node.walk()
    )


def _right_as_returned(value: Value | None) -> bool:
    """Whether what a helper returns holds KL terms, each with the gradient
    of the sequence KL as it is minimised."""
    if value is None:
        return False
    terms = [
        term
        for node in tensors_of(value)
        if not ir.is_detached(node)
        for term in sites.kl_terms(node)
    ]
    profiles = [sites.profile_of(term) for term in terms]
    return bool(profiles) and all(p is not None and p.sequence_correct for p in profiles)


def _handed_back_at_the_call(
    result: Value | None, bound: dict[str, Value], site: ir.Origin
) -> Value | None:
    """A helper that hands an argument back as its estimate
    (``kl_estimate(seq_log_ratio, kind="k1")`` returns ``log_ratio``): what it
    returns comes from the call, where its finding belongs, not from the
    caller's line that computed the argument."""
    given = {id(v) for v in bound.values() if isinstance(v, ir.Node)}

    def moved(value: Value) -> Value:
        if (
            isinstance(value, ir.Node)
            and id(value) in given
            and value.has_role(Role.REFERENCE_LOGP)
        ):
            return replace(value, origin=replace(site, handed_back=True))
        return value

    if isinstance(result, Choice):
        return Choice([(condition, moved(option)) for condition, option in result.options])
    return moved(result) if result is not None else None


def _given_a_function(bound: dict[str, Value]) -> bool:
    """Given a function to call (``kl_fn=functools.partial(token_kl, ...)``),
    a helper's own file cannot tell what it computes: its caller judges."""
    return any(isinstance(v, FuncRef) for v in bound.values())


def _signed_for_the_caller(value: Value) -> bool:
    """What a helper returns is a KL and nothing else, under the penalty's
    sign (``-coef * 0.5 * seq_lr**2``): signed for an objective its caller
    adds it to, the caller's sign decides what is minimised."""
    nodes = [node for node in tensors_of(value) if sinks.may_hold_kl(node)]
    if not nodes:
        return False
    for node in nodes:
        terms = sites.additive_terms(node)
        if not terms or not all(
            t.has_role(Role.REFERENCE_LOGP) and _penalised(t, negative=False) for t in terms
        ):
            return False
    return True


def _a_signed_kl_alone(value: Value) -> bool:
    """A KL under the penalty's sign and nothing else, not credited over
    time (``-0.5 * seq_lr**2``, not a running sum of per-token penalties)."""
    return _signed_for_the_caller(value) and not any(
        isinstance(n, ir.CumSum) for node in tensors_of(value) for n in node.walk()
    )


def _advantages_of(returned: cst.BaseExpression | None, value: Value) -> list[Value]:
    """What an advantage function returns that a loss reads as advantages:
    of ``return rewards, advantages, returns``, the element so named (the
    returns where no advantages are returned); anything else as a whole."""
    picked = _read_back(_named_elements(returned, value))
    return [item for _, item in picked] if picked else [value]


def _named_elements(returned: cst.BaseExpression | None, value: Value) -> list[tuple[str, Value]]:
    """``return logprobs, advantages``: each element's value by the name it is returned as."""
    if not (
        isinstance(returned, cst.Tuple)
        and isinstance(value, Seq)
        and len(value.items) == len(returned.elements)
    ):
        return []
    return [
        (element.value.value, item)
        for element, item in zip(returned.elements, value.items)
        if isinstance(element.value, cst.Name)
    ]


def _read_back(named: list[tuple[str, Value]]) -> list[tuple[str, Value]]:
    """Of what a function returns by name, what a policy-gradient loss reads
    back as its advantages: the advantages, else the returns."""
    return [(k, v) for k, v in named if sinks.is_advantage_key(k)] or [
        (k, v) for k, v in named if sinks.is_returns_key(k)
    ]


def _held_name(expr: cst.BaseExpression) -> str:
    """``returns`` of ``returns``, ``returns[i]``: the name a value is read by."""
    while isinstance(expr, cst.Subscript):
        expr = expr.value
    return expr.value if isinstance(expr, cst.Name) else ""


def _made_into_rewards(value: Value) -> bool:
    """Whether a KL estimate in what a helper returns was made into a reward
    there: credited by a running sum over time, or given the penalty's
    sign (``-beta * kl``, ``scores - beta * kl``), rather than returned as
    the estimate."""
    return any(
        _penalised(node, negative=False) for node in tensors_of(value) if sinks.may_hold_kl(node)
    )


def _names_in(expr: cst.BaseExpression) -> Iterator[str]:
    """The names an expression reads (``list(zip(ids, returns))``: ``ids``,
    ``returns``; ``rewards[i]``: ``rewards``), not attributes or the
    functions it calls."""
    stack: list[cst.CSTNode] = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, cst.Name):
            yield node.value
        elif isinstance(node, cst.Call):
            stack.extend(arg.value for arg in node.args)
        elif isinstance(node, (cst.Tuple, cst.List)):
            stack.extend(element.value for element in node.elements)
        elif isinstance(node, cst.Subscript):
            stack.append(node.value)  # ``rewards[i]``: one row of the rewards


def _added_to_a_reward(value: Value) -> bool:
    """``last_reward + kl_coef * kl`` returned by ``compute_reward``: the
    estimate joined to the task's reward there, whatever its sign (a plus
    is the bug, KL006, still the helper's own)."""
    return any(
        isinstance(node, ir.Binary)
        and node.op in ("add", "sub")
        and any(
            estimate.has_role(Role.REFERENCE_LOGP) and _a_reward(reward)
            for estimate, reward in ((node.left, node.right), (node.right, node.left))
        )
        for tensor in tensors_of(value)
        if sinks.may_hold_kl(tensor)
        for node in tensor.walk()
    )


def _a_reward(node: ir.Node) -> bool:
    """A reward beside an estimate: advantages, or a score kllint cannot read
    (``torch.zeros_like(kl).scatter_(..., src=r)``), not a log-prob."""
    return not node.has_role(Role.REFERENCE_LOGP) and any(
        isinstance(n, ir.Opaque) or (isinstance(n, ir.Atom) and n.role is Role.ADVANTAGE)
        for n in node.walk()
    )


# What an estimate is made of (a mask may be applied inside it).
_ESTIMATE_ROLES = frozenset({Role.POLICY_LOGP, Role.OLD_LOGP, Role.REFERENCE_LOGP, Role.MASK})


def _penalised(node: ir.Node, *, negative: bool) -> bool:
    """Top-down to the estimate (a value of log-probs and constants alone):
    whether the way there turns it into a penalty or a credit."""
    if not node.has_role(Role.REFERENCE_LOGP):
        return False
    literal = _literal_factor(node)
    if literal is not None:
        # ``-0.5 * seq_lr**2``: a literal's sign is the penalty's, whatever
        # the estimate it multiplies.
        number, scaled = literal
        return _penalised(scaled, negative=negative != (number < 0))
    if all(a.role in _ESTIMATE_ROLES for a in node.atoms()):
        return negative  # the estimate itself
    if isinstance(node, ir.CumSum):
        return True
    if isinstance(node, ir.Unary) and node.op == "neg":
        return _penalised(node.arg, negative=not negative)
    if isinstance(node, ir.Binary) and node.op == "sub":
        return _penalised(node.left, negative=negative) or _penalised(
            node.right, negative=not negative
        )
    if isinstance(node, ir.Binary) and node.op in ("mul", "div"):
        for factor, other in ((node.right, node.left), (node.left, node.right)):
            if not factor.has_role(Role.REFERENCE_LOGP):
                # ``-coef * 0.5 * kl``: a weight's sign, coefficients positive.
                return _penalised(other, negative=negative != (_sign(factor) < 0))
    return any(_penalised(child, negative=negative) for child in node.children())


def _literal_factor(node: ir.Node) -> tuple[float, ir.Node] | None:
    """``c * x``, ``x * c`` or ``x / c`` with ``c`` a number: ``(c, x)``."""
    if not isinstance(node, ir.Binary) or node.op not in ("mul", "div"):
        return None
    pairs = [(node.right, node.left)]
    if node.op == "mul":
        pairs.append((node.left, node.right))
    for factor, other in pairs:
        if isinstance(factor, ir.Const) and isinstance(factor.value, (int, float)):
            return float(factor.value), other
    return None


def _sign(weight: ir.Node) -> int:
    """The sign of a weight without the reference, its coefficients positive."""
    if isinstance(weight, ir.Const):
        return -1 if weight.value < 0 else 1
    if isinstance(weight, ir.Unary) and weight.op == "neg":
        return -_sign(weight.arg)
    if isinstance(weight, ir.Binary) and weight.op in ("mul", "div"):
        return _sign(weight.left) * _sign(weight.right)
    return 1


def _per_token_kl(value: Value) -> bool:
    """What a helper returns holds a KL term not yet reduced over each
    sequence (``low_var_kl(logp, ref)``), whatever the levels of the
    log-probs it was given: the same answer in the helper's own file and
    at its call, so that exactly one of them reports it."""
    return any(
        _per_token_reference(node, any_level=True)
        for node in tensors_of(value)
        if not ir.is_detached(node) and sinks.may_hold_kl(node)
    )


def _per_token_reference(node: ir.Node, *, any_level: bool = False) -> bool:
    """A reference log-prob of one token reached without passing a sum or a
    mean over time (``any_level``: or of a sequence, as a helper's own names
    may call one)."""
    return ir.reaches(
        node,
        found=lambda n: (
            isinstance(n, ir.Atom)
            and n.role is Role.REFERENCE_LOGP
            and (any_level or n.level is not ir.Level.SEQUENCE)
        ),
        stop=lambda n: isinstance(n, ir.Reduce) and n.axis in (ir.Axis.TIME, ir.Axis.ALL),
    )


def _loads_by_name(ref: FuncRef) -> bool:
    """A function that loads a module or looks a name up at run time."""
    names = ref.module.sketch.names(ref.cls.name if ref.cls is not None else None, ref.name)
    return names is not None and bool(names.called & {"import_module", "globals"})


def _builds_a_kl_object(ref: FuncRef) -> bool:
    """A classmethod factory (``return cls(...)``) of a class with a method
    that can compute a KL term."""
    if ref.cls is None:
        return False
    names = ref.module.sketch.names(ref.cls.name, ref.name)
    return (
        names is not None
        and "cls" in names.identifiers
        and bool(roles.methods_that_may_compute_kl(ref.module, ref.cls))
    )


def _makes_a_function(ref: FuncRef) -> bool:
    """Whether ``ref`` mentions a function nested in it (a factory that
    returns a closure), from the file's sketch: no parse."""
    sketch = ref.module.sketch
    cls = ref.cls.name if ref.cls is not None else None
    names = sketch.names(cls, ref.name)
    if names is None:
        return False
    top_level = set(ref.module.functions) | (set(ref.cls.methods) if ref.cls is not None else set())
    return any(
        (cls, name) in sketch.functions and name not in top_level and name != ref.name
        for name in names.identifiers
    )


def _log_probs_taken_of(fn: cst.FunctionDef, name: str) -> bool:
    """Whether ``fn`` computes log-probs from its parameter ``name``:
    ``selective_log_softmax(new, ids)``, ``new.log_softmax(-1)``,
    ``new.gather(...)`` (unsloth's ``new`` and ``ref`` are logits)."""
    for node in descendants(fn.body):
        if not isinstance(node, cst.Call):
            continue
        callee = dotted_name(node.func) or ""
        last = callee.rpartition(".")[2]
        if not roles.makes_log_probs(last):
            continue
        receiver = node.func.value if isinstance(node.func, cst.Attribute) else None
        given = [receiver, *(a.value for a in node.args)]
        if any(g is not None and (chain_names(g)[:1] == [name]) for g in given):
            return True
    return False


def _loss_added_to(returned: cst.BaseExpression | None) -> str | None:
    """``pg_loss + coef * kl`` (or ``- ...``): the loss-named variable."""
    if not (
        isinstance(returned, cst.BinaryOperation)
        and isinstance(returned.operator, (cst.Add, cst.Subtract))
    ):
        return None
    for side in (returned.left, returned.right):
        if isinstance(side, cst.Name) and sinks.is_loss_name(side.value):
            return side.value
    return None


def _rows(value: Value, label: str = "") -> list[tuple[str, Value]]:
    """What a value is on each branch, a list of per-sample tensors taken
    as one of its rows (``advantages = [adv_i - beta * kl_i for ...]``)."""
    if isinstance(value, Seq):
        return _rows(value.items[0], label) if value.items else []
    if isinstance(value, Choice):
        return [
            row
            for inner, option in value.options
            for row in _rows(option, AND.join(c for c in (label, inner) if c))
        ]
    return [(label, value)] if isinstance(value, ir.Node) else []


def _record_fields(cls: ClassInfo) -> list[str]:
    """A dataclass's fields in order: its annotated class-body names."""
    return [found.name for found in cls.fields if found.annotated]


def _log_probs_in(value: Value) -> bool:
    if isinstance(value, Choice):
        return any(_log_probs_in(v) for _, v in value.options)
    if isinstance(value, Unknown):
        # ``kl(self._get_per_token_logps(...), inputs["ref_logps"])``: log-probs
        # computed in the call or read by their name, not yet given a role.
        return value.logprob_op or any(roles.is_logprob_name(n) for n in value.names[-1:])
    return isinstance(value, ir.Node) and any(
        a.role in (Role.POLICY_LOGP, Role.REFERENCE_LOGP, Role.OLD_LOGP) for a in value.atoms()
    )


def _policy_log_probs_in(value: Value) -> bool:
    """Whether an argument holds the policy's log-probs: whether they carry a
    gradient is the caller's business. A reference's (a teacher's) does not
    make the verdict the caller's, nor do logits: a helper given logits
    forms the log-probs, and the estimate, itself."""
    if isinstance(value, Choice):
        return any(_policy_log_probs_in(v) for _, v in value.options)
    return isinstance(value, ir.Node) and any(
        a.role in (Role.POLICY_LOGP, Role.OLD_LOGP) and not roles.names_logits(a.name)
        for a in value.atoms()
    )


def _maximised(ref: FuncRef) -> bool:
    """A helper named like an objective (``sequence_objective``), or the
    ``__call__`` of an objective class (``ClippedPGObjective``): its caller
    minimises the negation of what it returns."""
    if ref.name in ("forward", "__call__") and ref.cls is not None:
        return sinks.names_an_objective(ref.cls.name)
    return sinks.names_an_objective(ref.name)


def _unpacked(value: Value, i: int) -> Value | None:
    """The ``i``-th of ``a, b = value``, or None when kllint cannot say."""
    if isinstance(value, Seq):
        return value.items[i] if i < len(value.items) else None
    if isinstance(value, DictVal):
        return value.items.get(value.positional[i]) if i < len(value.positional) else None
    if isinstance(value, ir.Node) and not isinstance(value, ir.Opaque):
        # ``advantages, returns = compute_gae(rewards, ...)``: both carry the rewards.
        return value
    if isinstance(value, Unknown):
        return Unknown(
            f"{value.text}[{i}]",
            value.names,
            value.call,
            value.stored,
            value.reference_model,
            value.logprob_op,
            value.detached,
        )
    if isinstance(value, Choice):
        # ``return scores, None`` when a flag is off, ``return shaped, kl``
        # when on: each name takes its element of each branch.
        items = [(label, _unpacked(option, i)) for label, option in value.options]
        if all(item is not None for _, item in items):
            return choice(items)  # type: ignore[arg-type]
    return None


def _makes_rewards(ref: FuncRef) -> bool:
    """``compute_rewards``; an object called for its rewards, by its class
    (``KLRewardShaper.__call__``); a function that returns what it names
    rewards (``return rewards``)."""
    if ref.name in ("forward", "__call__") and ref.cls is not None:
        if sinks.makes_rewards(ref.cls.name):
            return True
    elif sinks.makes_rewards(ref.name):
        return True
    return any(sinks.makes_rewards(name) for name in returned_names(ref.node))


def _key_error_handler(statement: cst.Try) -> cst.ExceptHandler | None:
    """The handler of ``except KeyError:`` (or ``(KeyError, ...)``)."""
    for handler in statement.handlers:
        caught = handler.type
        names = (
            [e.value for e in caught.elements]
            if isinstance(caught, cst.Tuple)
            else [caught]
            if caught is not None
            else []
        )
        if any(isinstance(n, cst.Name) and n.value == "KeyError" for n in names):
            return handler
    return None


def _assigned_from_itself(block: Sequence[cst.CSTNode]) -> set[str]:
    """Names a block reassigns from their own value (``kl = kl + later * score``)."""
    names: set[str] = set()
    for statement in block:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if (
                isinstance(small, cst.Assign)
                and len(small.targets) == 1
                and isinstance(small.targets[0].target, cst.Name)
            ):
                name = small.targets[0].target.value
                if any(
                    isinstance(n, cst.Name) and n.value == name for n in descendants(small.value)
                ):
                    names.add(name)
    return names


def _both_read_the_reference(body: Sequence[cst.CSTNode], else_body: Sequence[cst.CSTNode]) -> bool:
    def reads(block: Sequence[cst.CSTNode]) -> bool:
        return any(
            isinstance(node, cst.Name) and roles.has_words(node.value, roles.REFERENCE_WORDS)
            for statement in block
            for node in descendants(statement)
        )

    return bool(else_body) and reads(body) and reads(else_body)


def _remote_call_of(call: cst.Call, name: str) -> bool:
    """``actor.name.remote(...)`` or ``name.remote(...)``."""
    func = call.func
    if not (isinstance(func, cst.Attribute) and func.attr.value == "remote"):
        return False
    target = func.value
    return (isinstance(target, cst.Attribute) and target.attr.value == name) or (
        isinstance(target, cst.Name) and target.value == name
    )


def _times_read(source: str, name: str) -> int:
    """How many times the file's code (not its comments) reads an attribute
    ``name`` (a property)."""
    code_only = re.sub(r"#[^\n]*", "", source)
    return len(re.findall(rf"\.{re.escape(name)}\b(?!\s*[(=])", code_only))


def _times_called(calls: Counter[str], ref: FuncRef, call: cst.Call) -> int:
    """How many calls the file makes of ``ref``, by its name and by the
    module alias this call uses (``token_kl = full_vocab_kl``)."""
    called_as = _called_as(ref, call)
    alias = call.func.value if isinstance(call.func, cst.Name) else called_as
    return calls[called_as] + (calls[alias] if alias != called_as else 0)


def _called_as(ref: FuncRef, call: cst.Call) -> str:
    """The name a call uses: an object's ``forward`` is called by the
    attribute holding the object (``self.criterion(...)``)."""
    if ref.name in ("forward", "__call__"):
        func = call.func
        if isinstance(func, cst.Call):
            # ``KLShapedAdvantage(cfg)(logp, ...)``: built and called at once.
            func = func.func
        if isinstance(func, cst.Attribute):
            return func.attr.value
        if isinstance(func, cst.Name):
            return func.value
    return ref.name


def _may_be_a_generator(call: cst.Call) -> bool:
    """``self._micro_losses(batch)``, ``chain(pg_losses(), kl_losses())``: a
    call whose items a loop may run over, one by one (not ``range`` or a
    tensor method's pieces)."""
    name = dotted_name(call.func) or ""
    return name.rsplit(".", 1)[-1] not in _NOT_GENERATORS


# Calls a loop iterates whose items are not a generator's: counters, pairs,
# pieces of a tensor, a dict's entries.
_NOT_GENERATORS = (
    frozenset({"range", "zip", "enumerate", "reversed", "sorted", "items", "keys", "values"})
    | frozenset({"len", "DataLoader"})
    | lowering.SPLITS
)


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
        if _over_the_vocabulary(call):
            return None
        if len(call.args) == 3:
            step = call.args[2].value
            if isinstance(step, cst.UnaryOperation) and isinstance(step.operator, cst.Minus):
                return "reverse"
        return "forward"
    return None


def _over_the_vocabulary(call: cst.Call) -> bool:
    """``range(0, logits.size(-1), chunk)``, ``range(0, vocab_size, chunk)``:
    chunks of the vocabulary, whose sum is no running sum over time."""
    for node in descendants(call):
        if isinstance(node, cst.Name) and "vocab" in roles.words(node.value):
            return True
        if (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and node.func.attr.value == "size"
            and roles.names_logits(code(node.func.value).rpartition(".")[2])
            and len(node.args) == 1
            and code(node.args[0].value) == "-1"
        ):
            return True
    return False


def _method_call(statement: cst.CSTNode) -> cst.Call | None:
    """The call of a statement that is one call of a method
    (``model.set_adapter("ref")``, ``actor.requires_grad_(False)``)."""
    if (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(call := statement.body[0].value, cst.Call)
        and isinstance(call.func, cst.Attribute)
    ):
        return call
    return None


def _switch_method(statement: cst.CSTNode) -> str | None:
    call = _method_call(statement)
    return call.func.attr.value if call is not None else None  # type: ignore[attr-defined]


def _freeze_switch(statement: cst.CSTNode) -> tuple[str, bool] | None:
    """``self.actor.requires_grad_(False)``: (the model's code, True to
    freeze, False to thaw); None for any other statement."""
    call = _method_call(statement)
    if not (
        call is not None
        and isinstance(call.func, cst.Attribute)
        and call.func.attr.value == "requires_grad_"
        and len(call.args) == 1
        and isinstance(call.args[0].value, cst.Name)
        and call.args[0].value.value in ("True", "False")
    ):
        return None
    return code(call.func.value), call.args[0].value.value == "False"


def _thawed_models(statements: Sequence[cst.CSTNode]) -> set[str]:
    """The models a block thaws again (``requires_grad_(True)``), also in a
    ``finally``: only a freeze undone in the same place is a scoring pass."""
    found: set[str] = set()
    for statement in statements:
        blocks = [statement]
        if isinstance(statement, cst.Try) and statement.finalbody is not None:
            blocks = list(statement.finalbody.body.body)
        for inner in blocks:
            switch = _freeze_switch(inner)
            if switch is not None and not switch[1]:
                found.add(switch[0])
    return found


def _adapter_switch(statement: cst.CSTNode) -> bool | None:
    """``model.set_adapter("ref")`` (or ``cfg.adapters["ref"]``,
    ``args.ref_adapter``): True for a switch to the reference's adapter,
    False to another, None for a statement that switches none."""
    call = _method_call(statement)
    if not (
        call is not None
        and isinstance(call.func, cst.Attribute)
        and call.func.attr.value == "set_adapter"
        and call.args
    ):
        return None
    words = []
    for node in descendants(call.args[0].value):
        if isinstance(node, cst.Name):
            words.append(node.value)
        elif isinstance(node, cst.SimpleString) and isinstance(node.evaluated_value, str):
            words.append(node.evaluated_value)
    return any(
        roles.reference_evidence(w) and not roles.has_words(w, roles.KL_WORDS) for w in words
    )


def _assigned_names(body: cst.BaseSuite, *, unpacked: bool = False) -> list[str]:
    """Names a loop body assigns (``x = ...``, ``x += ...``; with
    ``unpacked``, also ``x, _ = ...``), in order; not those of functions
    defined in it. Statements only: an assignment is never inside an
    expression (LibCST's visitor would walk those too)."""
    names: list[str] = []

    def walk(node: cst.CSTNode) -> None:
        if isinstance(node, cst.SimpleStatementLine):
            for small in node.body:
                targets: list[cst.BaseExpression] = []
                if isinstance(small, cst.Assign):
                    targets = [t.target for t in small.targets]
                elif isinstance(small, cst.AugAssign):
                    targets = [small.target]
                if unpacked:
                    # ``a, _ = self.forward_with_values(...)``: each name.
                    targets = [
                        element.value
                        for t in targets
                        for element in (t.elements if isinstance(t, (cst.Tuple, cst.List)) else ())
                    ] + [t for t in targets if not isinstance(t, (cst.Tuple, cst.List))]
                for target in targets:
                    if isinstance(target, cst.Name) and target.value not in names:
                        names.append(target.value)
                    elif (
                        isinstance(small, cst.Assign)
                        and isinstance(target, cst.Subscript)
                        and isinstance(target.value, cst.Name)
                        and target.value.value not in names
                        and _reads(small.value, target.value.value)
                    ):
                        # ``G[:, t] = c[:, t] + G[:, t + 1]``: a buffer filled
                        # from its own next step, a recurrence like ``g = c + g``.
                        names.append(target.value.value)
        elif isinstance(node, cst.SimpleStatementSuite):
            walk(cst.SimpleStatementLine(body=node.body))
        elif not isinstance(node, cst.FunctionDef):
            for part in ("body", "orelse", "handlers", "finalbody"):
                child = getattr(node, part, None)
                if isinstance(child, (list, tuple)):
                    for item in child:
                        walk(item)
                elif isinstance(child, cst.CSTNode):
                    walk(child)

    walk(body)
    return names


def _reads(expr: cst.BaseExpression, name: str) -> bool:
    return any(isinstance(n, cst.Name) and n.value == name for n in descendants(expr))


def _has_selector_parameter(fn: cst.FunctionDef) -> bool:
    """A parameter that may pick a branch or say what the tensors are: a
    string default, a name such as ``kind``, ``estimator``, ``kl_type``,
    ``mode``, a config object (``self`` with its settings), or log-probs the
    caller computed."""
    params = fn.params
    positional = [*params.posonly_params, *params.params]
    if positional and positional[0].name.value in ("self", "cls"):
        return True
    for param in named_params(fn):
        if isinstance(param.default, (cst.SimpleString, cst.ConcatenatedString)):
            return True
        if roles.is_logprob_name(param.name.value):
            return True
        ws = set(roles.words(param.name.value))
        if ws & (selectors.SELECTOR_WORDS | selectors.CONFIG_WORDS | {"type", "mode", "variant"}):
            return True
    return isinstance(params.star_kwarg, cst.Param)


def helper_label(ref: FuncRef) -> str:
    """How a helper is named in messages: ``name`` (path:line)."""
    if library.is_library(ref.module):
        return f"`{ref.name}` ({ref.module.path.name.strip('<>')}, as kllint models it)"
    path = ref.module.path
    try:
        shown = path.relative_to(Path.cwd()).as_posix()
    except ValueError:
        shown = path.as_posix()
    line = (
        ref.module.line_of_method(ref.cls.name, ref.name)
        if ref.cls is not None
        else ref.module.line_of_def(ref.name)
    )
    return f"`{ref.name}` ({shown}:{line})" if line else f"`{ref.name}` ({shown})"


# A registry: a mapping written out by name (``KL_LOSSES = {...}``, at module
# level or on ``self``), and one of its entries: a function or class (or an
# object built with no arguments) under a quoted or dotted key.
_REGISTRY = re.compile(r"[ \t]*(?:self\.)?(\w+)[ \t]*(?::[^=\n]+)?=[ \t]*\{")
_ASSIGNED_DICT = re.compile(r"=[ \t]*\{")
_REGISTERED = re.compile(
    r"""(?:["']|\b[A-Z]\w*\.\w+)\s*:\s*([A-Za-z_]\w*)\s*(?:\(\s*\))?\s*[,}\n]"""
)


def registered_callables(source: str) -> frozenset[str]:
    """Functions and classes a module stores in a registry that it also reads
    by key (``KL_LOSSES[cfg["kl_loss"]]()``): each is called where the
    registry is read, with the configuration that picks one, so none is
    judged on its own."""
    if "{" not in source:
        return frozenset()
    found: set[str] = set()
    for brace in _ASSIGNED_DICT.finditer(source):
        line_start = source.rfind("\n", 0, brace.start()) + 1
        match = _REGISTRY.match(source, line_start, brace.end())
        if match is None:
            continue
        close = source.find("}", match.end())
        if close < 0:
            continue
        entries = _REGISTERED.findall(source, match.end() - 1, close + 1)
        if not entries:
            continue
        read = re.compile(rf"\b{match.group(1)}\s*(?:\[|\.get\()")
        if read.search(source, 0, match.start()) or read.search(source, close + 1):
            found.update(entries)
    return frozenset(found)


def called_names(source: str) -> Counter[str]:
    """Functions and methods a module calls by name (``f(...)``, ``self.f(...)``,
    ``cls.f(...)``; not ``x.f(...)``, a ``def`` or a ``class``), each with the
    number of calls written. A text scan from each ``(`` back to the name
    before it: a LibCST visitor over the whole module costs more than the
    parse, and a regular expression tried at every character a fifth of it."""
    found: Counter[str] = Counter()
    commented = False  # the line the bracket is on has a ``#`` before it
    if '"""' in source or "'''" in source:
        # A docstring that shows a call (``self.reward_fn(...)``) calls nothing.
        source = TRIPLE_QUOTED.sub('""', source)
    source = outside_tests(source)
    # ``grad(step_terms)(...)``: ``step_terms`` is called there.
    if may_transform(source):
        found.update(CALLED_THROUGH.findall(source))
    for piece in source.split("(")[:-1]:
        line_start = piece.rfind("\n")
        if line_start >= 0:
            commented = "#" in piece[line_start:]
        elif "#" in piece:
            commented = True
        if commented:
            continue  # ``# NeMo-RL's ClippedPGLossFn (a loss)``: a comment calls nothing
        end = len(piece.rstrip())
        start = end
        while start and _in_word(piece[start - 1]):
            start -= 1
        if start == end or not (piece[start].isascii() and not piece[start].isdigit()):
            continue  # no name before the bracket, or ``1e3(`` / ``é(``
        before = piece[:start]
        receiver = 5 if before.endswith("self.") else 4 if before.endswith("cls.") else 0
        if receiver:
            head = len(before) - receiver
            if head == 0 or not _in_word(before[head - 1]):  # ``self.f(``, not ``myself.f(``
                found[piece[start:end]] += 1
        elif not (before and (_in_word(before[-1]) or before[-1] == ".")) and not before.endswith(
            ("def ", "class ")
        ):
            found[piece[start:end]] += 1
    return found


def _in_word(char: str) -> bool:
    return char.isalnum() or char == "_"


_CALLED: dict[int, tuple[ModuleInfo, frozenset[str]]] = {}


def _called_in(module: ModuleInfo) -> frozenset[str]:
    cached = _CALLED.get(id(module))
    if cached is None or cached[0] is not module:
        cached = (module, frozenset(called_names(module.source)))
        _CALLED[id(module)] = cached
    return cached[1]


def iter_functions(
    module: ModuleInfo, keep: Callable[[tuple[str | None, str]], bool] | None = None
) -> Iterator[tuple[cst.FunctionDef, ClassInfo | None]]:
    """Every function and method of a module, nested ones included; with
    ``keep``, only those it keeps by (class, name), so that a function not
    kept is never parsed."""

    def nested(
        fn: cst.FunctionDef, cls: ClassInfo | None
    ) -> Iterator[tuple[cst.FunctionDef, ClassInfo | None]]:
        yield fn, cls
        for child in _walk_defs(fn.body):
            yield from nested(child, cls)

    for name in list(module.functions):
        if keep is None or keep((None, name)):
            yield from nested(module.functions[name], None)
    for cls in module.classes.values():
        for name in list(cls.methods):
            if keep is None or keep((cls.name, name)):
                yield from nested(cls.methods[name], cls)


def inherited_hook_callers(
    project: Project, module: ModuleInfo
) -> Iterator[tuple[FuncRef, ClassInfo]]:
    """Methods a class of ``module`` inherits from a base of the project
    that call a method, or read a class attribute, which the class's own
    method resolution order takes from elsewhere than the base's: a base
    trainer's ``compute_loss`` calling ``self._kl_term(...)``, a hook that a
    subclass or a mixin listed before the base fills in, or reading
    ``self.kl_estimator`` that a subclass's body sets again. Each runs again
    for the class, whose ``self`` then reaches the override (Python binds
    ``self`` late). A mixin is left to the classes that mix it in: in
    theirs, another mixin's method may come first."""
    # Classes named as one of several bases (``class GRPOTrainer(KLToGoMixin,
    # LogRatioKLMixin)``), and how often.
    mixed = Counter(
        base.split(".")[-1]
        for bases in module.sketch.classes.values()
        if len(bases) > 1
        for base in bases
    )
    used = _names_used(module.source, set(mixed)) if mixed else Counter()
    for cls in module.classes.values():
        # Named only in its own ``class`` line and as an ingredient of others:
        # a mixin, never built on its own here.
        if not cls.bases or (cls.name in mixed and used[cls.name] == mixed[cls.name] + 1):
            continue
        order = list(project.lineage(cls, module))
        mixes = len(cls.bases) > 1
        # A class with one base leaves to that base what the base's own order
        # already resolves (its rerun covers it): only what the class itself
        # defines counts. A class that mixes several bases in counts all that
        # the defining base does not see.
        above = {id(c) for c, _ in order[1:]} if not mixes and len(order) > 1 else None
        for name, base, where in project.inherited(cls, module):
            names = where.sketch.functions.get((base.name, name))
            if name == "__init__" or names is None:
                continue
            seen_by_base = above or {id(c) for c, _ in project.lineage(base, where)}
            # A hook counts where the method calls it; a setting also where a
            # method it calls reads it (``prepare`` calling ``apply_kl_penalty``,
            # which reads ``self.kl_penalty_type``).
            if _rebound(order, seen_by_base, names.called, _reach(order, names), mixes):
                yield FuncRef(base.methods[name], where, base, bound=True), cls


def _reach(order: list[tuple[ClassInfo, ModuleInfo]], names: FunctionNames) -> set[str]:
    """The names a method reads, with those of the methods of ``order`` it
    calls on ``self``, and so on."""
    called, read = set(names.called), set(names.identifiers)
    pending = list(called)
    while pending:
        name = pending.pop()
        for current, where in order:
            if name in current.methods:
                more = where.sketch.functions.get((current.name, name))
                if more is not None:
                    pending += more.called - called
                    called |= more.called
                    read |= more.identifiers
                break
    return read


def _rebound(
    order: list[tuple[ClassInfo, ModuleInfo]],
    seen_by_base: set[int],
    called: set[str],
    read: set[str],
    mixed: bool,
) -> bool:
    """Whether a method called or a setting read off the class resolves, in
    ``order``, to a class that the base's own order does not hold."""
    for index, (current, where) in enumerate(order):
        if id(current) in seen_by_base:
            continue
        earlier = order[:index]
        for name in called.intersection(current.methods):
            if (
                name != "__init__"
                and not any(name in c.methods for c, _ in earlier)
                and _may_shape_a_kl(where, current.name, name, mixed=mixed)
            ):
                return True
        if not any(where.may_assign_in_a_body(name) for name in read):
            continue  # no class body of its file sets a name read
        for f in current.fields:
            if (
                f.name in read
                and _read_as_a_setting(f)
                and not any(g.name == f.name for c, _ in earlier for g in c.fields)
            ):
                return True
    return False


# Words of a hook that works on log-probs or their ratios (``_aggregate_log_ratio``
# returning ``log_ratio * response_mask``), whatever it names a KL.
_HOOK_WORDS = roles.LOGPROB_WORDS | roles.KL_WORDS | {"ratio", "ratios"}


def _may_shape_a_kl(module: ModuleInfo, cls: str, name: str, *, mixed: bool) -> bool:
    """An override that can change a KL term: it may compute one, or, in a
    class that mixes several bases in, it works on log-probs or their ratios
    (a mixin's ``_aggregate_log_ratio``; not ``_save_checkpoint``). A single
    chain of subclasses (an engine per backend) is reread only for the
    first kind."""
    if roles.sketch_may_compute_kl(module.sketch, cls, name):
        return True
    if not mixed:
        return False
    names = module.sketch.functions.get((cls, name))
    return names is not None and any(
        roles.has_words(identifier, _HOOK_WORDS) for identifier in names.identifiers
    )


def _read_as_a_setting(field: ClassField) -> bool:
    """A class attribute the interpreter reads off ``self`` as a setting:
    a string that names an estimator (``kl_estimator = "k3"``), or a flag
    (``use_kl_loss = True``); not ``_name = "GRPO"`` for a model card."""
    if isinstance(field.literal, str):
        return field.name.isupper() or selectors.names_a_selector(field.name)
    return not field.annotated and field.flag_default is not None


def _names_used(source: str, names: set[str]) -> Counter[str]:
    """How often each of ``names`` is written in ``source`` outside comments
    and docstrings (a name in another string counts: as if the class were
    built from it)."""
    code = re.sub(r"#[^\n]*", "", TRIPLE_QUOTED.sub('""', source))
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(names))) + r")\b")
    return Counter(pattern.findall(code))


# The name a wrapped function's result is held under while its wrapper's
# return expression is read.
_WRAPPED_RESULT = "__wrapped_result__"


def _wrapper_return(
    decorator: cst.Decorator, module: ModuleInfo
) -> tuple[cst.BaseExpression, cst.Call] | None:
    """``@negate`` where ``def negate(fn)`` defines a ``wrapper`` that returns
    ``-fn(*args, **kwargs)`` and returns the wrapper: that return expression
    and the call of ``fn`` in it."""
    if not isinstance(decorator.decorator, cst.Name):
        return None
    factory = module.functions.get(decorator.decorator.value)
    if factory is None or not factory.params.params:
        return None
    wrapped = factory.params.params[0].name.value
    body = factory.body.body if isinstance(factory.body, cst.IndentedBlock) else []
    returned = next(
        (
            s.body[0].value.value
            for s in reversed(body)
            if isinstance(s, cst.SimpleStatementLine)
            and isinstance(s.body[0], cst.Return)
            and isinstance(s.body[0].value, cst.Name)
        ),
        None,
    )
    inner = next(
        (s for s in body if isinstance(s, cst.FunctionDef) and s.name.value == returned),
        None,
    )
    if inner is None or not isinstance(inner.body, cst.IndentedBlock) or len(inner.body.body) != 1:
        return None
    line = inner.body.body[0]
    if not (isinstance(line, cst.SimpleStatementLine) and isinstance(line.body[0], cst.Return)):
        return None
    expression = line.body[0].value
    if expression is None:
        return None
    calls = [
        node
        for node in descendants(expression)
        if isinstance(node, cst.Call)
        and isinstance(node.func, cst.Name)
        and node.func.value == wrapped
    ]
    if len(calls) != 1 or expression is calls[0]:
        return None
    return expression, calls[0]


def _walk_defs(body: cst.BaseSuite) -> Iterator[cst.FunctionDef]:
    if not isinstance(body, cst.IndentedBlock):
        return
    for statement in body.body:
        if isinstance(statement, cst.FunctionDef):
            yield statement
        elif isinstance(statement, (cst.If, cst.For, cst.While, cst.With, cst.Try)):
            yield from _walk_defs(statement.body)


# The most terms a loop over a list or dict of them is run for, one by one.
_UNROLLED_TERMS = 8


def _next_step(scan: ir.Node, added: ir.Node, discount: ir.Node | None) -> ir.Node:
    """The scan one step on, from ``scan_t = added_t + discount * scan_next``.
    A mask in the discount is 1 on the tokens that count: only a number divides."""
    rest = ir.binary("sub", scan, added, scan.origin)
    if discount is None or any(a.role is Role.MASK for a in discount.atoms()):
        return rest
    return ir.binary("div", rest, discount, scan.origin)


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


def _picks_with_a_literal(call: cst.Call) -> bool:
    """``kl_penalty(logp, ref, kl_type="k3")``: the call names a choice."""
    return any(isinstance(a.value, (cst.SimpleString, cst.ConcatenatedString)) for a in call.args)


def _logits(value: Value) -> bool:
    """``student_logits``, ``model(ids).logits``: logits, not yet log-probs."""
    return isinstance(value, Unknown) and any(roles.names_logits(n) for n in value.names[-1:])


def _loads_data(iterable: cst.BaseExpression) -> bool:
    """``DataLoader(buffer)``, ``self.train_dataloader``: what iterating it
    yields is data read back, not computed by the model being trained."""
    called = iterable.func if isinstance(iterable, cst.Call) else iterable
    name = dotted_name(called)
    return name is not None and roles.loads_data(name.rpartition(".")[2])


def _annotated_as_a_distribution(param: cst.Param) -> bool:
    annotation = param.annotation.annotation if param.annotation is not None else None
    name = dotted_name(annotation) if annotation is not None else None
    return name is not None and name.rpartition(".")[2] in lowering.DISTRIBUTION_TYPES
