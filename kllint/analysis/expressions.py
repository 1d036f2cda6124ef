"""Expressions: names, literals, operators, attributes, subscripts and
conditions evaluated to abstract values (Python semantics; what a tensor
operation means is the torch vocabulary's business, in ``lowering``)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import replace

import libcst as cst

from kllint.analysis import ir, lowering, roles, selectors
from kllint.analysis.frame import Frame
from kllint.analysis.ir import Role
from kllint.analysis.lowering import split_tensor
from kllint.analysis.module import (
    ClassInfo,
    ImportedName,
    ModuleInfo,
    decorator_names,
    dotted_name,
    unparsed,
)
from kllint.analysis.project import Project, dotted_module_name
from kllint.analysis.syntax import (
    children,
    code,
    descendants,
    full_code,
    int_literal,
    named_params,
    string_key,
)
from kllint.analysis.values import (
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
    dict_key,
    has_distribution,
    negate_condition,
    note_default,
    shown_key,
    written_attribute,
)

BINOPS = {"Add": "add", "Subtract": "sub", "Multiply": "mul", "Divide": "div", "Power": "pow"}


class Expressions(Frame):
    def eval(self, expr: cst.BaseExpression) -> Value:
        try:
            return self._eval(expr)
        except RecursionError:
            return Unknown(code(expr), ("deep",))

    def number(self, expr: cst.Integer | cst.Float) -> ir.Node:
        literal = expr.value.replace("_", "")
        if isinstance(expr, cst.Integer):
            value = float(min(int(literal, 0), _HUGE))
        else:
            value = float(literal)
        if value >= _HUGE:
            # A scale the dual-number evaluation would overflow on (1e200 ** 2):
            # a coefficient, whose size does not change the gradient's direction.
            return ir.Atom(Role.COEFFICIENT, expr.value[:12])
        return ir.Const(value, origin=self.origin(expr))

    def _eval(self, expr: cst.BaseExpression) -> Value:
        # One lookup by the node's class (LibCST's are final): a chain of
        # ``isinstance`` tests against its ABC-based classes cost a Python
        # call for every test that failed, ~5% of a run.
        method = _EVALUATORS.get(type(expr))
        if method is None:
            return Unknown(code(expr), (type(expr).__name__,))
        return getattr(self, method)(expr)  # by name: the layers above override some

    def eval_name(self, expr: cst.Name) -> Value:
        return self.lookup(expr.value)

    def eval_string(self, expr: cst.SimpleString | cst.ConcatenatedString) -> Value:
        text = expr.evaluated_value
        return Py(text if isinstance(text, str) else None)

    def eval_formatted_string(self, expr: cst.FormattedString) -> Value:
        """``f"kl_{name}"`` with ``name`` a setting kllint reads: the name it
        spells (``getattr(estimators, f"kl_{cfg.kl_estimator}")``)."""
        pieces: list[str] = []
        for part in expr.parts:
            if isinstance(part, cst.FormattedStringText):
                pieces.append(part.value)
                continue
            assert isinstance(part, cst.FormattedStringExpression)
            plain = part.format_spec is None and part.conversion is None and part.equal is None
            value = self.eval(part.expression) if plain else None
            if not isinstance(value, Py) or not isinstance(value.value, (str, int)):
                return Py(None)
            pieces.append(str(value.value))
        return Py("".join(pieces))

    def eval_binary(self, expr: cst.BinaryOperation) -> Value:
        op = BINOPS.get(type(expr.operator).__name__)
        if op == "sub" and _boundary_difference(expr):
            # ``csum[cu_seqlens[1:]] - csum[cu_seqlens[:-1]]`` of a running sum
            # over packed tokens: each sequence's sum, a sum over time.
            whole = self.eval(expr.left.value)  # type: ignore[attr-defined]
            running = _running_sum(whole)
            if running is not None:
                per_sequence = ir.Reduce("sum", ir.Axis.TIME, running.arg, origin=self.origin(expr))
                return per_sequence if running is whole else ir.detach(per_sequence)
        left, right = self.eval(expr.left), self.eval(expr.right)
        if isinstance(expr.operator, cst.MatrixMultiply):
            summed = lowering.matmul(self.torch_call(expr), left, right)
            if summed is None:
                summed = lowering.weighted_sum(self.torch_call(expr), left, right)
            if summed is None:
                flattened = _flattened(expr.left) or _flattened(expr.right)
                summed = lowering.masked_dot(self.torch_call(expr), left, right, flattened)
            if summed is not None:
                return summed
        if isinstance(expr.operator, cst.BitOr) and isinstance(right, DictVal):
            # ``rollout | {"kl": ...}``: a copy of the record with entries
            # added, read back by key as ``dict(rollout, kl=...)`` is.
            return DictVal({**self.entries_of(left), **right.items})
        if op is None:
            return Unknown(code(expr), ("binop",))
        if isinstance(left, Unknown) and op == "sub" and _normaliser_of(expr.right, expr.left):
            # ``z - torch.logsumexp(z, -1, keepdim=True)``: the log-softmax of
            # ``z`` over its last axis, the vocabulary (or a top-k support of
            # log-probs, renormalised).
            patterns = self.context.role_patterns
            return replace(
                left,
                text=code(expr),
                call=True,
                logprob_op=True,
                distribution=True,
                reference_model=left.reference_model
                or any(patterns.role_from_words(n) is Role.REFERENCE_LOGP for n in left.names),
            )
        if isinstance(left, Unknown) and not left.logprob_op:
            if op in ("div", "mul") and roles.has_words(
                left.names[-1] if left.names else "", roles.LOGIT_WORDS
            ):
                # ``teacher_logits / temperature``: still the teacher's logits.
                return replace(left, text=code(expr))
        shifted = lowering.shifted_logits(op, left, right, expr) or lowering.max_added_back(
            op, left, right
        )
        if shifted is not None:
            return shifted
        log_prob = lowering.normalised_gather(op, left, right, _gathers_tokens(expr.left))
        if isinstance(log_prob, Unknown):
            # ``ref_logits - log_z``: the log-probs of the logits named, as for
            # ``torch.logsumexp`` above.
            patterns = self.context.role_patterns
            return replace(
                log_prob,
                reference_model=log_prob.reference_model
                or any(patterns.role_from_words(n) is Role.REFERENCE_LOGP for n in log_prob.names),
            )
        if log_prob is not None:
            return log_prob
        if op == "sub" and self.picks_tokens(expr.right):
            # ``lse - target_logit``: a cross-entropy written by hand (a
            # vocab-parallel one), the negated log-prob of the sampled token.
            picked = lowering.normalised_gather(op, right, left)
            logits = (
                [n for n in picked.names if roles.names_logits(n)]
                if isinstance(picked, Unknown)
                else []
            )
            if isinstance(picked, Unknown) and logits:
                # Named after its logits: no variable names this log-prob.
                log_prob = self.resolve(replace(picked, distribution=False), logits[-1])
                return self.lift1(log_prob, lambda n: ir.neg(n, self.origin(expr)))
        return self.binary(op, left, right, expr)

    def picks_tokens(self, expr: cst.BaseExpression) -> bool:
        """The sampled tokens' entries, picked here or where the local name
        read here was assigned once (``tgt = logits.gather(-1, ids) * hit``)."""
        if isinstance(expr, cst.Name) and self.function_node is not None:
            assigned = _local_assignments(self.function_node).get(expr.value, [])
            return len(assigned) == 1 and _gathers_tokens(assigned[0])
        return _gathers_tokens(expr)

    def eval_condition(self, expr: cst.Comparison | cst.BooleanOperation) -> Value:
        if isinstance(expr, cst.BooleanOperation) and isinstance(expr.left, cst.Name):
            # ``level or "token"`` of a known string: the operand Python returns.
            # (Of a local name only: evaluating any other left operand here,
            # then again for the condition, doubles the work at every level
            # of a chain of ``or``.)
            left = self.eval(expr.left)
            if isinstance(left, Py) and isinstance(left.value, (str, int, float, type(None))):
                if bool(left.value) == isinstance(expr.operator, cst.Or):
                    return left
                return self.eval(expr.right)
        truth = self.truth(expr)
        return Py(truth) if truth is not None else Unknown(code(expr), ("condition",))

    def entries_of(self, record: Value) -> dict[str, Value]:
        """The entries kllint knows of a record: a dict it holds, or what was
        written by key into a container it does not hold."""
        if isinstance(record, DictVal):
            return record.items
        return self.context.entries(record) if isinstance(record, Unknown) else {}

    def eval_await(self, expr: cst.Await) -> Value:
        return self.eval(expr.expression)

    def eval_yield(self, expr: cst.Yield) -> Value:
        """``yield loss``: what the generator gives its caller's loop, once
        per time the body runs; ``yield from`` another generator (or a list),
        each item it gives. What is sent back in is unknown."""
        if isinstance(expr.value, cst.From):
            given = self.eval(expr.value.item)
            items = given.items if isinstance(given, Seq) else [given]
        elif expr.value is not None:
            items = [self.eval(expr.value)]
        else:
            items = []
        for item in items:
            if self.no_grad and isinstance(item, (ir.Node, Choice, Flipped, Grouped)):
                # A ``no_grad`` generator runs every resumption without gradient.
                item = self.lift1(item, ir.detach)
            self.yielded.append(item)
        return Unknown(code(expr), ("sent",))

    def eval_named_expression(self, expr: cst.NamedExpr) -> Value:
        """``(beta := args.beta) > 0``: the value, bound to the name as well."""
        value = self.eval(expr.value)
        self.assign(expr.target, value, expr)
        return value

    def eval_lambda(self, expr: cst.Lambda) -> Value:
        # A lambda written in a function reads its locals when called; one
        # in a module constant (a dispatch table) reads only the module.
        local = self.function_node is not None and not self.in_constant
        return FuncRef(
            _lambda_as_function(expr), self.module, closure=self.scope() if local else None
        )

    def eval_unary(self, expr: cst.UnaryOperation) -> Value:
        inner = expr.expression
        if (
            isinstance(expr.operator, cst.Minus)
            and isinstance(inner, cst.BinaryOperation)
            and isinstance(inner.operator, cst.FloorDivide)
            and isinstance(inner.left, cst.UnaryOperation)
            and isinstance(inner.left.operator, cst.Minus)
        ):
            # ``-(-n // size)``: Python's ceiling division, as positive as
            # ``n // size`` (the number of micro-batches).
            return self.eval(inner.with_changes(left=inner.left.expression))
        operand = self.eval(inner)
        if isinstance(expr.operator, cst.Minus):
            return self.lift1(operand, lambda n: ir.neg(n, self.origin(expr)))
        if isinstance(expr.operator, cst.Plus):
            return operand
        if isinstance(expr.operator, cst.Not):
            truth = self.truth(expr.expression)
            return Py(not truth) if truth is not None else Unknown(code(expr), ("not",))
        if isinstance(expr.operator, cst.BitInvert):
            mask = self.resolve(operand) if isinstance(operand, Unknown) else operand
            if isinstance(mask, ir.Atom) and mask.role is Role.MASK:
                # ``~padding_mask``: the tokens a padding mask leaves, a mask too.
                return ir.Atom(Role.MASK, code(expr), mask.level, origin=self.origin(expr))
        return Unknown(code(expr), ("unary",))

    def eval_if_expression(self, expr: cst.IfExp) -> Value:
        truth = self.truth(expr.test)
        if truth is True:
            return self.eval(expr.body)
        if truth is False:
            return self.eval(expr.orelse)
        label = self.condition_label(expr.test)
        flag = self.flag_defaults.pop(id(expr.test), None)
        if flag is not None:
            # ``ratio if self.use_is else torch.ones_like(ratio)``: a feature
            # flag stays open, its default remembered, as for an ``if``.
            note_default(label, flag)
        return choice(
            [(label, self.eval(expr.body)), (negate_condition(label), self.eval(expr.orelse))]
        )

    def eval_display(self, expr: cst.Tuple | cst.List | cst.Dict) -> Value:
        """A tuple, list or dict written out."""
        if isinstance(expr, cst.Dict):
            return DictVal({key: self.eval(value) for key, value in self.dict_entries(expr)})
        if isinstance(expr, cst.List) and not expr.elements:
            return Seq([], appended=True)  # a list to be filled by ``.append``
        return Seq([self.eval(e.value) for e in expr.elements if isinstance(e, cst.Element)])

    def eval_dict_comprehension(self, expr: cst.DictComp) -> Value:
        """``{k: v[idx] for k, v in batch.items()}`` over a known dict (a
        minibatch cut from a rollout): the same entries, each transformed. Of
        a batch kllint does not hold, the entries written into it
        (``data["advantages"] = ...``) are the ones it knows."""
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
            if isinstance(table, Unknown) and self.context.entries(table):
                table = DictVal(self.context.entries(table))
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
        if loop.inner_for_in is None and not loop.ifs and isinstance(loop.target, cst.Name):
            # ``{name: partial(approx_kl, kind=name) for name in ("k1", "k3")}``:
            # a registry built over literals, one entry per literal.
            keys = self.eval(source)
            classes = self.registered_classes(keys, expr.key, loop.target.value)
            if classes is not None:
                # ``{cls.name: cls for cls in (K1, K2, K3)}``: each class under
                # the constant its body gives the attribute.
                return DictVal(classes)
            if isinstance(keys, Seq) and keys.items and all(isinstance(k, Py) for k in keys.items):
                bound = loop.target.value
                saved_value = self.env.get(bound)
                registry: dict[str, Value] = {}
                for literal in keys.items:
                    self.env[bound] = literal
                    written = self.eval(expr.key)
                    held = dict_key(written.value) if isinstance(written, Py) else None
                    if held is not None:
                        registry[held] = self.eval(expr.value)
                if saved_value is None:
                    self.env.pop(bound, None)
                else:
                    self.env[bound] = saved_value
                return DictVal(registry)
        return Unknown(code(expr), ("comprehension",))

    def registered_classes(
        self, classes: Value, key: cst.BaseExpression, bound: str
    ) -> dict[str, Value] | None:
        """Classes of the project keyed by a constant of each class's body
        (``cls.name`` with ``name = "k1"`` in ``class K1``), else None."""
        if not (
            isinstance(classes, Seq)
            and classes.items
            and isinstance(key, cst.Attribute)
            and isinstance(key.value, cst.Name)
            and key.value.value == bound
        ):
            return None
        registry: dict[str, Value] = {}
        for item in classes.items:
            if not isinstance(item, Unknown) or item.class_name is None:
                return None
            found = self.context.project.class_named(item.class_name, self.module)
            if found is None:
                return None
            constant = selectors.class_constant(found[1], found[0].name, key.attr.value)
            held = dict_key(constant.value) if constant is not None else None
            if held is None:
                return None
            registry[held] = item
        return registry

    def eval_comprehension(self, expr: cst.ListComp | cst.GeneratorExp) -> Value:
        """``[k3(lp, ref) for lp, ref in zip(logps, ref_logps)]`` over micro-
        batches: like a loop body, the element is evaluated once with the
        loop variables bound to what each row is; one item stands for every row."""
        entries = self.each_entry(expr)
        if entries is not None:
            return entries
        to_go = _sum_from_each_step(expr)
        if to_go is not None:
            # ``[rewards[:, t:].sum(-1) for t in range(T)]``: the reward-to-go at
            # each step, stacked back over time.
            summed = self.eval(to_go)
            origin = self.origin(expr)
            return Seq(
                [self.lift1(summed, lambda n: ir.CumSum(n, reverse=True, origin=origin))],
                appended=True,
            )
        if not (
            self.iterates_tensors(expr.for_in.iter)
            or self.computes_logprobs(expr.elt)
            # ``[{k: v[i : i + mbs] for k, v in batch.items()} for i in range(...)]``:
            # micro-batches of a batch, each with the entries written into it.
            or isinstance(expr.elt, cst.DictComp)
            # ``[torch.tensor(r) for r in rows]``, ``[torch.ones(n) for n in
            # lengths]``: rows without a graph, whatever they are named after (a
            # rollout engine's log-probs, a padded mask).
            or _makes_a_new_tensor(expr.elt)
            or self.slices_a_held_tensor(expr)
        ):
            return Unknown(code(expr), ("comprehension",))
        saved = dict(self.env)
        loop: cst.CompFor | None = expr.for_in
        while loop is not None:
            self.bind_loop_target(loop.target, loop.iter, expr)
            loop = loop.inner_for_in
        item = self.eval(expr.elt)
        self.env = saved
        return Seq([item], appended=True)

    def each_entry(self, expr: cst.ListComp | cst.GeneratorExp) -> Seq | None:
        """``coefs[name] * value for name, value in losses.items()`` over a dict
        kllint holds (named losses, weighted from the config): one element per
        entry, each with its own key and value, as ``sum`` adds them."""
        loop = expr.for_in
        target, iterable = loop.target, loop.iter
        if loop.inner_for_in is None and isinstance(target, cst.Name):
            return self.each_module(expr, target.value)
        unpacked = self.each_tuple(expr)
        if unpacked is not None:
            return unpacked
        if not (
            loop.inner_for_in is None
            and isinstance(iterable, cst.Call)
            and isinstance(iterable.func, cst.Attribute)
            and iterable.func.attr.value == "items"
            and not iterable.args
            and isinstance(target, cst.Tuple)
            and len(target.elements) == 2
            and all(isinstance(e.value, cst.Name) for e in target.elements)
        ):
            return None
        held = self.eval(iterable.func.value)
        if not isinstance(held, DictVal) or not held.items:
            return None
        key_name, value_name = (e.value.value for e in target.elements)  # type: ignore[attr-defined]
        return self.element_per(
            expr, [{key_name: Py(key), value_name: item} for key, item in held.items.items()]
        )

    def held_rows(self, iterable: cst.BaseExpression) -> list[Value]:
        """What a comprehension runs over, when kllint holds it: the values of
        a dict (``terms.values()``) or the items of a list written out."""
        values = _values_call(iterable)
        held = self.eval(iterable.func.value if values else iterable)  # type: ignore[attr-defined]
        if values and isinstance(held, DictVal):
            return list(held.items.values())
        if not values and isinstance(held, Seq) and not held.appended:
            return held.items
        return []

    def each_tuple(self, expr: cst.ListComp | cst.GeneratorExp) -> Seq | None:
        """``coef * value for coef, value in terms.values()`` over the
        (weight, loss) pairs a dict (or a list) kllint holds: one element
        per pair, its parts bound to the loop's names."""
        loop = expr.for_in
        target, iterable = loop.target, loop.iter
        if loop.inner_for_in is not None or not isinstance(target, cst.Tuple):
            return None
        names = [e.value.value for e in target.elements if isinstance(e.value, cst.Name)]
        if len(names) != len(target.elements):
            return None
        if not (_values_call(iterable) or isinstance(iterable, (cst.Name, cst.Attribute))):
            return None
        rows = self.held_rows(iterable)
        pairs = [row for row in rows if isinstance(row, Seq) and len(row.items) == len(names)]
        if not pairs or len(pairs) != len(rows):
            return None
        return self.element_per(expr, [dict(zip(names, pair.items)) for pair in pairs])

    def element_per(
        self, expr: cst.ListComp | cst.GeneratorExp, rows: list[dict[str, Value]]
    ) -> Seq:
        """The comprehension's element once per row, its loop variables bound
        as the row says. An entry a filter certainly drops (``if
        weights.get(name, 0.0) != 0.0``) is left out; one it may keep is in."""
        saved = dict(self.env)
        items = []
        for row in rows:
            self.env.update(row)
            if all(self.truth(test.test) is not False for test in expr.for_in.ifs):
                items.append(self.eval(expr.elt))
        self.env = saved
        return Seq(items)

    def each_module(self, expr: cst.ListComp | cst.GeneratorExp, bound: str) -> Seq | None:
        """``loss(batch) for loss in self.losses.values()`` (or over an
        ``nn.ModuleList``): one element per loss object the container holds."""
        modules = self.held_rows(expr.for_in.iter)
        if not modules or not all(isinstance(m, (Instance, FuncRef)) for m in modules):
            return None
        return self.element_per(expr, [{bound: module} for module in modules])

    def computes_logprobs(self, element: cst.BaseExpression) -> bool:
        """``[response_logprobs(policy, p, r) for p, r in zip(prompts, responses)]``:
        an element that names a log-prob or what computes one, over rows of
        anything (prompts, responses) kllint does not hold."""
        return any(
            isinstance(node, cst.Name) and roles.relevant_identifier(node.value)
            for node in descendants(element)
        )

    def slices_a_held_tensor(self, expr: cst.ListComp | cst.GeneratorExp) -> bool:
        """``[values[s:e].sum() for s, e in zip(cu_seqlens[:-1], cu_seqlens[1:])]``:
        an element that reads a tensor kllint holds (one that may carry a KL
        term) at positions the loop gives, over boundaries it does not hold."""
        bound = {
            n.value
            for loop in _loops(expr.for_in)
            for n in descendants(loop.target)
            if isinstance(n, cst.Name)
        }
        return any(
            isinstance(node, cst.Subscript)
            and isinstance(node.value, cst.Name)
            and node.value.value in self.env
            and node.value.value not in bound
            and roles.may_carry_kl(self.env[node.value.value])
            for node in descendants(expr.elt)
        )

    def iterates_tensors(self, iterable: cst.BaseExpression) -> bool:
        """Over rows kllint holds (``logps``, ``zip(logps, ref_logps)``, a list
        of micro-batches): a comprehension over anything else (``range``,
        ``.items()``) is not evaluated, as it holds no KL term to follow."""
        pieces = split_tensor(iterable)
        if pieces is not None:
            return self.iterates_tensors(pieces)
        if isinstance(iterable, cst.Call) and isinstance(iterable.func, cst.Name):
            if iterable.func.value in ("zip", "enumerate"):
                return any(self.iterates_tensors(a.value) for a in iterable.args)
            if iterable.func.value == "range" and len(iterable.args) == 1:
                # ``for i in range(len(log_probs))``: an index into each row.
                length = iterable.args[0].value
                return (
                    isinstance(length, cst.Call)
                    and isinstance(length.func, cst.Name)
                    and length.func.value == "len"
                    and len(length.args) == 1
                    and self.iterates_tensors(length.args[0].value)
                )
        if isinstance(iterable, cst.Name):
            value = self.env.get(iterable.value)
        elif isinstance(iterable, (cst.Call, cst.Attribute, cst.Subscript)):
            # ``unpack_sequences(per_token_loss, seq_lens)``,
            # ``per_token_loss.squeeze(0)``: what the expression holds.
            value = self.eval(iterable)
        else:
            return False
        return (isinstance(value, Seq) and bool(value.items)) or (
            isinstance(value, (ir.Node, Choice)) and not isinstance(value, ir.Opaque)
        )

    def lookup(self, name: str) -> Value:
        if name in self.env:
            return self.env[name]
        if name in ("True", "False", "None"):
            return Py({"True": True, "False": False, "None": None}[name])
        if name == "__name__":
            # ``f"{__name__}.LowVarKL"``: a dotted path to this module's class,
            # loaded at run time (``importlib.import_module``).
            return Py(dotted_module_name(self.module.path), MODULE_NAME)
        return self.module_scope(name)

    def module_scope(self, name: str) -> Value:
        """What ``name`` is in the module, whatever a function's locals call so."""
        if name in self.module.functions and not (
            name in self.module.imports and self.module.imported_over_definition(name)
        ):
            return FuncRef(unparsed(self.module.functions, name), self.module)
        if name in self.module.classes:
            return Unknown(name, (name,), module=None, class_name=name)
        if name in self.module.imports:
            return self.imported(name, self.module.imports[name])
        if name in self.module.constants:
            constant = self.module.constants[name]
            if name in self.module.configured_globals:
                # ``KL_LOSS_TYPE = args.kl_loss_type`` in ``configure(args)``:
                # the setting's default.
                return self.eval(constant)
            if isinstance(constant, (cst.Dict, cst.DictComp, cst.Lambda)):
                return self.eval_constant(constant)  # a dispatch table: {"k3": low_var_kl, ...}
            if isinstance(constant, cst.Call) and selectors.read_with_a_default(constant):
                return self.eval(constant)  # KL_ESTIMATOR = os.environ.get("KL_ESTIMATOR", "k3")
            if isinstance(constant, cst.Call) and (dotted_name(constant.func) or "").endswith(
                "partial"
            ):
                # mse_kl = functools.partial(kl_penalty, kind="mse")
                return self.eval_constant(constant)
            if (
                isinstance(constant, cst.Name)
                and constant.value != name
                and (
                    constant.value in self.module.functions or constant.value in self.module.imports
                )
            ):
                # ``compute_kl = kl_penalty``: an old name kept for a renamed
                # function, read in the module (a parameter named ``kl_penalty``
                # in the function calling ``compute_kl`` does not shadow it).
                return self.module_scope(constant.value)
            if isinstance(constant, (cst.Tuple, cst.List)) and self.function_list(constant):
                # ``KL_ABLATIONS = [("k1", lambda lp, ref, m: lp - ref), ...]``:
                # a dispatch table indexed by position.
                return self.eval_constant(constant)
            if isinstance(constant, (cst.Tuple, cst.List)) and all(
                isinstance(e.value, cst.SimpleString) for e in constant.elements
            ):
                # ``KL_LOG_ESTIMATORS = ("k1", "k2", "k3")``: names a loop goes through.
                return self.eval(constant)
            if isinstance(constant, (cst.SimpleString, cst.Integer, cst.Float, cst.Name)):
                return (
                    self.eval(constant)
                    if not isinstance(constant, cst.Name)
                    else Unknown(name, (name,))
                )
        star = self.star_imported(name) if self.module.star_imports else None
        if star is not None:
            return star
        return Unknown(name, (name,))

    def read_property(self, method: FuncRef, expr: cst.BaseExpression) -> Value:
        """``kl_term.mse``: the property's method, run where it is read."""
        call = cst.Call(func=expr)
        self.property_reads[id(call)] = (call, expr)
        try:
            return self.inline(method, call)
        finally:
            del self.property_reads[id(call)]

    def module_setting(self, dotted: str, attr: str) -> Py | None:
        """A module constant that is a string setting (``KL_ESTIMATOR = "k3"``,
        or read from the environment with a fallback), of the module
        ``dotted`` names as this one imports it."""
        level = len(dotted) - len(dotted.lstrip("."))
        target = self.context.project.resolve_module(dotted.lstrip("."), self.module.path, level)
        constant = target.constants.get(attr) if target is not None else None
        if target is None or not (
            isinstance(constant, (cst.SimpleString, cst.ConcatenatedString))
            or (isinstance(constant, cst.Call) and selectors.read_with_a_default(constant))
        ):
            return None
        value = self.eval_in_module(constant, target, constant=True)
        return value if isinstance(value, Py) and isinstance(value.value, str) else None

    def eval_in_module(
        self, expr: cst.BaseExpression, where: ModuleInfo, *, constant: bool = False
    ) -> Value:
        """An expression written in another module, read with that module's names."""
        saved = self.module
        self.module = where
        try:
            return self.eval_constant(expr) if constant else self.eval(expr)
        finally:
            self.module = saved

    def imported(self, name: str, imported: ImportedName) -> Value:
        """A name ``from x import name`` gives (at the top of the file or in a
        function): ``DEFAULT_KL_REDUCTION`` from the package's constants
        module, named as a constant, so that the many imported modules and
        functions a trainer names are not loaded for it; a table of functions."""
        project = self.context.project
        constant = (
            project.imported_constant(name, self.module, imported) if name.isupper() else None
        )
        if constant is not None:
            return self.eval(constant)
        table = project.imported_table(name, self.module, imported) if name.isupper() else None
        if table is not None:
            return self.imported_dispatch(*table)
        return Unknown(name, (name,), module=imported.dotted)

    def star_imported(self, name: str) -> Value | None:
        """``per_token_kl`` taken by ``from .kl import *``: the name of the
        module that defines it, also through a package that re-exports it
        with a star import of its own (``from ..utils import *`` where
        ``utils/__init__.py`` has ``from .kl import *``)."""
        for star in self.module.star_imports:
            source = self.context.project.resolve_module(star.module, self.module.path, star.level)
            if source is None or source is self.module:
                continue
            if name in source.functions or name in source.classes or name in source.constants:
                return self.imported(name, ImportedName(star.module, name, star.level))
            found = _star_source(self.context.project, source, name, depth=2)
            if found is not None and name in found.functions:
                return FuncRef(unparsed(found.functions, name), found)
        return None

    def function_list(self, constant: cst.Tuple | cst.List) -> bool:
        """Every item a function (a lambda, or one the module defines or
        imports), or a tuple of names and such a function."""

        def function(node: cst.BaseExpression) -> bool:
            return isinstance(node, cst.Lambda) or (
                isinstance(node, cst.Name)
                and (node.value in self.module.functions or node.value in self.module.imports)
            )

        def item(node: cst.BaseExpression) -> bool:
            if isinstance(node, cst.Tuple):
                parts = [e.value for e in node.elements]
                return any(map(function, parts)) and all(
                    function(p) or isinstance(p, cst.SimpleString) for p in parts
                )
            return function(node)

        elements = [e for e in constant.elements if isinstance(e, cst.Element)]
        return (
            bool(elements)
            and len(elements) == len(constant.elements)
            and all(item(e.value) for e in elements)
        )

    def imported_dispatch(self, table: cst.Dict, where: ModuleInfo) -> DictVal:
        """An imported dispatch table (``{"k3": low_var_kl, ...}``): each
        function it names is the one of the module that holds the table."""
        return DictVal(
            {
                key: FuncRef(unparsed(where.functions, value.value), where)
                if isinstance(value, cst.Name) and value.value in where.functions
                else Unknown(code(value), (key,))
                for key, value in self.dict_entries(table)
            }
        )

    def dict_entries(self, expr: cst.Dict) -> Iterator[tuple[str, cst.BaseExpression]]:
        """The entries of a dict literal whose key kllint can read."""
        for element in expr.elements:
            if isinstance(element, cst.DictElement):
                key = self.eval(element.key)
                held = dict_key(key.value) if isinstance(key, Py) else None
                if held is not None:
                    yield held, element.value

    def eval_constant(self, constant: cst.BaseExpression) -> Value:
        """A module-level constant, evaluated where it is used: its lambdas
        close over the module, not over the function that reads it."""
        saved, self.in_constant = self.in_constant, True
        try:
            return self.eval(constant)
        finally:
            self.in_constant = saved

    def setting_default(self, base: Unknown, name: str) -> Py | None:
        """``config.kl_loss_type`` or ``config["kl_loss_type"]``: the one
        default the project gives that setting, if any, as the config
        class's ``__post_init__`` leaves it."""
        default = selectors.config_default(
            self.context.project,
            self.context.fs_path,
            self.module,
            self.function_node,
            self.cls,
            base,
            name,
            flags=True,
        )
        if default is not None and isinstance(default.value, str):
            found = selectors.settings_class(
                self.context.project, self.module, self.function_node, self.cls, base
            ) or selectors.declaring_class(self.module, name, default.value)
            if found is not None:
                default = self.validated_setting(found[0], found[1], name, default)
                return self.post_init_setting(found[0], found[1], name, default)
        return default

    def validated_setting(self, config: ClassInfo, where: ModuleInfo, name: str, default: Py) -> Py:
        """A pydantic validator of the field that runs on its default
        (``validate_default=True``, or v1's ``always=True``): the value it
        returns for the default (``str(value).strip().lower()``)."""
        for method_name, method in config.methods.items():
            for decorator in method.decorators:
                call = decorator.decorator
                if not (
                    isinstance(call, cst.Call)
                    and (dotted_name(call.func) or "").rpartition(".")[2]
                    in ("field_validator", "validator")
                    and any(
                        isinstance(a.value, cst.SimpleString)
                        and a.value.evaluated_value in (name, "*")
                        for a in call.args
                        if a.keyword is None
                    )
                ):
                    continue
                always = any(
                    a.keyword is not None
                    and a.keyword.value == "always"
                    and isinstance(a.value, cst.Name)
                    and a.value.value == "True"
                    for a in call.args
                )
                if not (always or selectors.validates_defaults(where, config)):
                    continue
                ref = self.context.project.method(config, where, method_name)
                if ref is None:
                    continue
                validator_call = cst.Call(
                    func=cst.Name(method_name), args=[cst.Arg(cst.Name("value"))]
                )
                value = self.inline(ref, validator_call, evaluated=[default])
                if isinstance(value, Py) and isinstance(value.value, str):
                    default = Py(value.value, default.source)
        return default

    def post_init_setting(self, config: ClassInfo, where: ModuleInfo, name: str, default: Py) -> Py:
        """``self.kl_estimator = _KL_ALIASES[self.kl_estimator.strip().lower()]``
        in the config class's ``__post_init__``: the setting it normalises,
        evaluated on the defaults of the fields."""
        hook = config.methods.get("__post_init__")
        if hook is None or not isinstance(hook.body, cst.IndentedBlock):
            return default
        assigned = _init_assignments(hook).get(name, [])
        if len(assigned) != 1 or name in _branch_assignments(hook):
            return default
        fields: dict[str, Value] = {
            field: Py(value, default.source)
            for field, value in selectors.field_literals(config).items()
        }
        fields[name] = default
        saved = self.env, self.function_node, self.module
        self.env, self.function_node, self.module = {"self": DictVal(fields)}, hook, where
        try:
            for local, value in _init_locals(hook, set(_names_in(assigned[0])), known={"self"}):
                self.env[local] = self.eval(value)
            normalised = self.eval(assigned[0])
        finally:
            self.env, self.function_node, self.module = saved
        return normalised if isinstance(normalised, Py) else default

    def eval_attribute(self, expr: cst.Attribute) -> Value:
        return self.attribute(self.eval(expr.value), expr.attr.value, expr)

    def attribute(self, base: Value, attr: str, expr: cst.BaseExpression) -> Value:
        """``base.attr``; also ``getattr(base, "attr")``."""
        if isinstance(base, Instance):
            attrs = base.built()
            if attr in attrs:
                return attrs[attr]
            method = self.context.project.method(base.cls, base.module, attr)
            if method is not None and method.is_property:
                # ``mb.ref_log_ratio`` with ``@cached_property def ref_log_ratio``;
                # most properties (a model's ``device``) can change no verdict.
                bound_method = replace(method, receiver=base)
                if not self.may_matter(bound_method, {}):
                    return Unknown(code(expr), (attr,))
                return self.read_property(bound_method, expr)
            if method is not None:
                return replace(method, receiver=base)
            function = self.class_function(base.cls, base.module, attr)
            if function is not None:
                return function
            if base.unbuilt and self.cls is base.cls:
                # In its own method: a setting ``__init__`` reads with a
                # default (``config.get("kl_type", "k1_rtg")``), as for ``self``.
                setting = self.setting_in_init(attr)
                if setting is not None:
                    return setting
                # ``self.tensor_keys = _AcceptedKeys()``: an object ``__init__`` builds.
                built = self.built_in_init(attr)
                if built is not None:
                    return built
            constant = selectors.class_setting(self.context.project, base.cls, base.module, attr)
            if constant is not None:
                # ``self.level`` of a ``class SequenceK3(K3, level="sequence")``
                # object, or a class body's ``kl_type = "k3"``.
                return constant
            if base.unbuilt:
                # ``exp.kl_estimator`` of a dataclass parameter (``exp:
                # Experience``): the field's default, as a run that does not
                # set it has.
                field = selectors.record_field_default(
                    self.context.project, base.module, base.cls, attr
                )
                if field is not None:
                    return field
            flag = selectors.field_flag(base.cls, attr)
            # ``exp.action_log_probs`` of ``exp: Experience``: rollout data, as
            # read from a container named so.
            holder = (
                (expr.value.value,)
                if isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name)
                else ()
            )
            rollout_data = base.unbuilt and roles.from_container((*holder, base.cls.name))
            return Unknown(code(expr), (attr,), default_flag=flag, stored=rollout_data)
        if isinstance(base, DictVal) and attr in base.items:
            # A record's field (``ref.logprobs``): a log-prob goes by the name
            # the caller reads it with, not the one the helper computed it as.
            return _renamed_log_prob(base.items[attr], code(expr))
        owner = (
            expr.value.value
            if isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name)
            else base.names[0]
            if isinstance(base, Unknown) and len(base.names) == 1
            else None
        )
        if isinstance(base, Unknown) and owner is not None and not base.call:
            # ``self.kl = ...`` (a rollout method keeping what it computed on
            # the worker) or ``experience.returns = ...`` earlier in this
            # function (also on a row of a loop): read back as written.
            written = self.env.get(written_attribute(owner, attr))
            if written is not None:
                return written
            stored = self.context.shared_entries.get(attr)
            if stored is not None:
                # ``experience.kl``, a record's KL field that another function
                # of the file filled (``Experience(..., kl, ...)``).
                return stored
        if (
            isinstance(base, Unknown)
            and base.names == ("self",)
            and self.cls is not None
            and self.function_name != "__init__"
        ):
            built = self.built_in_init(attr) or self.held_from_init(attr)
            if built is not None:
                return built
            setting = self.setting_in_init(attr)
            if setting is not None:
                return setting
            assert self.self_class is not None
            constant = selectors.class_setting(
                self.context.project, *self.self_class, attr
            ) or selectors.class_flag(self.context.project, *self.self_class, attr)
            if constant is not None:
                return constant
            method = self.context.project.method(*self.self_class, attr)
            if method is None:
                function = self.class_function(*self.self_class, attr)
                if function is not None:
                    return function
            if method is not None and method.is_property:
                return self.read_property(method, expr)
            if method is not None:
                # ``kl_fn = getattr(self, f"_kl_{cfg.kl_loss_type}")``, then
                # ``kl_fn(logp, ref)``: the method, called where it is called.
                return method
        if isinstance(base, (ir.Node, Choice)) and not isinstance(base, ir.Opaque):
            lowered = lowering.tensor_attribute(self.torch_call(expr), attr, base)
            return lowered if lowered is not None else Unknown(code(expr), (attr,))
        if isinstance(base, Unknown) and base.class_name is not None:
            registry = self.module.constants.get(f"{base.class_name}.{attr}")
            if registry is not None:
                return self.eval_constant(registry)  # filled by a decorator of the class
            static = self.static_method(base.class_name, attr)
            if static is not None:
                return static  # ``getattr(KLEstimators, cfg.kl_estimator_type)``
            member = selectors.class_constant(self.module, base.class_name, attr)
            if member is not None:
                return member  # ``KLEstimator.K3``: an Enum member stands for its value
        if (
            isinstance(base, Unknown)
            and base.module is not None
            and len(base.names) == 1
            and attr.isupper()
        ):
            # ``C.KL_ESTIMATOR`` of ``from . import constants as C``: a setting
            # of another module of the project.
            setting = self.module_setting(base.module, attr)
            if setting is not None:
                return setting
        if (
            isinstance(base, Unknown)
            and base.module is not None
            and len(base.names) == 1
            and base.names[0][:1].isupper()
        ):
            # The same, for a class imported from another module of the project.
            found = self.context.project.class_named(base.names[0], self.module)
            member = selectors.class_constant(found[1], found[0].name, attr) if found else None
            if member is not None:
                return member
        if isinstance(base, Py) and attr in ("value", "name"):
            return base if attr == "value" else Py(None)
        if isinstance(base, Unknown) and attr == "shape" and base.module is None:
            return ir.Atom(Role.COEFFICIENT, code(expr))
        if isinstance(base, Unknown) and attr == "values" and base.names[-1:] in _SELECTIONS:
            # ``logits.max(-1).values``: the selected entries of the tensor, not
            # a critic's values.
            return replace(base, text=code(expr))
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
                same_as=self.context.attribute_of(base, attr),
            )
            default = self.setting_default(base, attr)
            if default is not None and isinstance(default.value, bool):
                return replace(unknown, default_flag=default.value)
            if default is None and self.negative_coefficient(attr):
                # ``--kl-bonus-coef`` defaulting to -0.02 ("negative = penalty"):
                # a coefficient's sign is its default's, whatever its size.
                return ir.neg(ir.Atom(Role.COEFFICIENT, code(expr)))
            number = (
                selectors.number_setting(
                    self.context.project,
                    self.module,
                    self.function_node,
                    self.cls,
                    base.names,
                    attr,
                )
                if default is None and not base.call and base.module is None
                else None
            )
            if number is None and default is None and roles.weight_role(attr) is Role.COEFFICIENT:
                # ``shaping.length_penalty_weight`` of a settings object kllint
                # cannot type: the package's one number for it, if it has one.
                number = self.package_number(attr)
            if number is not None:
                return ir.Atom(Role.COEFFICIENT, code(expr), default=number)
            return default if default is not None else unknown
        if isinstance(base, (FuncRef, Py)):
            return Unknown(code(expr), (attr,))
        return Unknown(code(expr), (attr,))

    def class_function(self, cls: ClassInfo, module: ModuleInfo, attr: str) -> Value | None:
        """``kl_fn = staticmethod(low_var_kl)`` (or ``kl_fn = low_var_kl``) in
        the body of the class or, nearest first, of a base: the function an
        object of the class calls as ``self.kl_fn(...)``."""
        key = (id(cls), attr)
        known = _CLASS_FUNCTIONS.get(key)
        if known is None or known[0] is not cls:
            known = _CLASS_FUNCTIONS[key] = (cls, self._class_function_written(cls, module, attr))
        written = known[1]
        if written is None:
            return None
        value, where = written
        found = self.eval_in_module(value, where)
        return found if isinstance(found, FuncRef) else None

    def _class_function_written(
        self, cls: ClassInfo, module: ModuleInfo, attr: str
    ) -> tuple[cst.BaseExpression, ModuleInfo] | None:
        for current, where in self.context.project.lineage(cls, module):
            # The class's fields are read from its text, once its file assigns
            # the name in some block; its LibCST node is parsed only when the
            # class body assigns the name a function.
            if not where.assigns_in_a_block(attr) or not any(
                f.name == attr and f.function_like for f in current.fields
            ):
                continue
            for statement in current.node.body.body:
                if not (
                    isinstance(statement, cst.SimpleStatementLine)
                    and isinstance(statement.body[0], cst.Assign)
                    and len(statement.body[0].targets) == 1
                    and isinstance(statement.body[0].targets[0].target, cst.Name)
                    and statement.body[0].targets[0].target.value == attr
                ):
                    continue
                value = statement.body[0].value
                if (
                    isinstance(value, cst.Call)
                    and (dotted_name(value.func) or "") in ("staticmethod", "classmethod")
                    and value.args
                ):
                    value = value.args[0].value
                return (value, where) if isinstance(value, (cst.Name, cst.Lambda)) else None
        return None

    def weight_setting(self, base: Unknown, key: str, expr: cst.Subscript) -> ir.Node | None:
        """``self.config.loss_weights["kl_loss"]`` of a settings dict whose
        default gives the entry a number: a coefficient with that number's
        sign (``"kl_loss": -0.1`` subtracts the term it weighs)."""
        chain = tuple(base.text.split(".")) if _DOTTED_NAME.fullmatch(base.text) else ()
        at = next(
            (i for i, n in enumerate(chain) if set(roles.words(n)) & selectors.CONFIG_WORDS),
            None,
        )
        if at is None or at + 1 >= len(chain):
            return None
        path = ".".join((*chain[at + 1 :], key))
        numbers = [
            d.value
            for d in self.context.project.config_defaults(self.context.fs_path, path)
            if isinstance(d.value, (int, float)) and not isinstance(d.value, bool)
        ]
        if not numbers:
            return None
        weight = ir.Atom(Role.COEFFICIENT, code(expr))
        if all(n < 0 for n in numbers):
            return ir.neg(weight)
        return weight if all(n > 0 for n in numbers) else None

    def package_number(self, attr: str) -> tuple[float, str] | None:
        """The one number the package's settings give ``attr`` (a YAML value
        before a class's default), and where."""
        defaults = self.context.project.config_defaults(self.context.fs_path, attr)
        defaults = [d for d in defaults if d.kind == "yaml"] or defaults
        numbers = {
            float(d.value): d.source
            for d in defaults
            if isinstance(d.value, (int, float)) and not isinstance(d.value, bool)
        }
        if len(numbers) != 1 or len(numbers) != len({repr(d.value) for d in defaults}):
            return None
        return next(iter(numbers.items()))

    def negative_coefficient(self, attr: str) -> bool:
        """A setting named like a coefficient whose every default in the
        package is a negative number."""
        known = self.context.negative_coefficients.get(attr)
        if known is None:
            defaults = (
                self.context.project.config_defaults(self.context.fs_path, attr)
                if roles.weight_role(attr) is Role.COEFFICIENT
                else []
            )
            known = self.context.negative_coefficients[attr] = bool(defaults) and all(
                isinstance(d.value, (int, float)) and not isinstance(d.value, bool) and d.value < 0
                for d in defaults
            )
        return known

    def static_method(self, class_name: str, name: str) -> FuncRef | None:
        """``KLEstimators.k2``, a static method of a class of this module
        named without calling it: the function itself."""
        found = self.context.project.class_named(class_name, self.module)
        ref = self.context.project.method(found[0], found[1], name) if found else None
        if ref is None or "staticmethod" not in decorator_names(ref.node):
            return None
        return ref

    def held_from_init(self, attr: str) -> Instance | None:
        """``self.kl_regularizer = kl_regularizer`` in ``__init__``, of a
        parameter annotated with a called class of the project
        (``kl_regularizer: KLRegularizer``): an object of that class."""
        assert self.cls is not None
        if not selectors.holds_a_parameter(self.module, self.cls, attr):
            return None
        init = _constructor(self.cls, attr)
        if init is None:
            return None
        held = _init_assignments(init).get(attr, [])
        if len(held) != 1 or not isinstance(held[0], cst.Name):
            return None
        return self.callable_of_type(held[0].value, init)

    def built_in_init(self, attr: str) -> Instance | Seq | None:
        """``self.kl_loss_fn`` set once in ``__init__`` to an object of a
        class of the project built from literals, settings or ``__init__``'s
        own parameters (``KLLoss(kind="k3")``, ``KLEstimator(config.kl_estimator)``,
        ``DistillLoss(temperature=temperature)``), or to a list of such
        objects (loss callbacks, each called in turn)."""
        assert self.cls is not None
        if not selectors.builds_object(self.module, self.cls, attr):
            return None
        init = _constructor(self.cls, attr)
        if init is None:
            return None
        built = _init_assignments(init).get(attr, []) or self.chosen_in_init(init, attr)
        if len(built) != 1:
            return None
        if isinstance(built[0], (cst.List, cst.Tuple)):
            calls = [e.value for e in built[0].elements]
            if not calls or not all(isinstance(c, cst.Call) for c in calls):
                return None
            objects = [self.object_built(init, c) for c in calls]  # type: ignore[arg-type]
            if not all(isinstance(o, Instance) for o in objects):
                return None
            return Seq(list(objects))  # type: ignore[arg-type]
        if not isinstance(built[0], cst.Call):
            return None
        return self.object_built(init, built[0])

    def object_built(self, init: cst.FunctionDef, call: cst.Call) -> Instance | None:
        """The object ``__init__`` builds by ``call``, when what it is given
        carries no KL term (literals, settings, its own parameters)."""
        if not all(
            selectors.is_selector_literal(a.value)
            or isinstance(a.value, (cst.Float, cst.Attribute, cst.Name))
            or _setting_read(a.value)
            for a in call.args
        ):
            return None
        if (
            isinstance(call.func, cst.Attribute)
            and isinstance(call.func.value, cst.Name)
            and call.func.value.value[:1].isupper()
        ):
            # ``KLPenalty.from_config(args)``: the object a classmethod factory
            # builds from the settings.
            (made,) = self.eval_in_init(init, [call])
            return made if isinstance(made, Instance) else None
        found = self.class_built(init, call.func)
        if found is None:
            return None
        if not any(
            self.context.project.method(found[0], found[1], name) is not None
            for name in ("forward", "__call__")
        ) and not any(
            # ``self.kl_callback = KLPenaltyCallback(beta)``, whose ``on_loss``
            # adds the KL to the loss it is handed.
            name != "__init__"
            and roles.may_compute_kl(found[1], name, found[0], self.context.role_patterns)
            for name in found[0].methods
        ):
            if not all(selectors.is_selector_literal(a.value) for a in call.args):
                return None
            # ``self.tensor_keys = _AcceptedKeys()``: a record of settings
            # (TorchRL's key names), each field what its literal says.
            (made,) = self.eval_in_init(init, [call])
            if (
                isinstance(made, Instance)
                and made.cls is found[0]
                and made.attrs
                and all(isinstance(v, Py) for v in made.attrs.values())
            ):
                return made
            return None
        # Literals, settings, and parameters of ``__init__`` (a temperature)
        # kllint cannot read: nothing that carries a KL term.
        arguments = self.eval_in_init(init, [a.value for a in call.args])

        def inert(v: Value, setting: bool) -> bool:
            # Literals, coefficients (``self.args.beta``), settings, and a
            # choice between them (``self.args = args or Args()``).
            if isinstance(v, Choice):
                return all(inert(option, setting) for _, option in v.options)
            return (
                isinstance(v, Py)
                or (isinstance(v, ir.Node) and ir.settings_only(v))
                or (isinstance(v, Unknown) and (not v.call or setting))
                # A config record (``loss_config: GRPOLossConfig =
                # GRPOLossConfig()``): its fields are literals.
                or (
                    isinstance(v, Instance)
                    and v.pending is None
                    and all(isinstance(f, Py) for f in v.attrs.values())
                )
            )

        if not all(inert(v, _setting_read(a.value)) for a, v in zip(call.args, arguments)):
            return None
        return self.instantiate(found[0], found[1], call, arguments)

    def chosen_in_init(self, init: cst.FunctionDef, attr: str) -> list[cst.BaseExpression]:
        """``if config.kl_estimator == "seq_k2": self.kl = SequenceK2()
        elif ...``: the value of the branch the settings' defaults take, when
        every branch of one ``if`` at the top of ``__init__`` sets ``self.attr``
        (or raises) and the conditions can be read."""
        for chain in _branch_assignments(init).get(attr, []):
            for test, value in chain:
                if test is None:
                    return [value] if value is not None else []
                (taken,) = self.eval_in_init(init, [test])
                if not isinstance(taken, Py) or not isinstance(taken.value, bool):
                    return []
                if taken.value:
                    return [value] if value is not None else []
        return []

    def class_built(
        self, init: cst.FunctionDef, func: cst.BaseExpression
    ) -> tuple[ClassInfo, ModuleInfo] | None:
        """The class of the project ``__init__`` builds: named
        (``KLLoss(...)``) or picked from a registry by a setting
        (``KL_MODULES[cfg.kl_estimator]()``, the setting's default read)."""
        if isinstance(func, cst.Name) and func.value.lstrip("_")[:1].isupper():
            return self.context.project.class_named(func.value, self.module)
        if not (
            isinstance(func, cst.Subscript)
            and isinstance(func.value, cst.Name)
            and func.value.value[:1].isupper()
        ):
            return None
        (picked,) = self.eval_in_init(init, [func])
        if not isinstance(picked, Unknown) or picked.class_name is None:
            return None
        return self.context.project.class_named(picked.class_name, self.module)

    def setting_in_init(self, attr: str) -> Py | ir.Node | FuncRef | Seq | DictVal | Unknown | None:
        """``self.kl_type`` set once, in ``__init__``, from the settings it was
        given, with ``__init__``'s parameters unknown: the selector it reads
        (``KLType(cfg.get("kl_type", KLType.K3))``), a number of the settings
        (``cfg["reference_policy_kl_penalty"]``: a coefficient without
        gradient, whatever words it is named by), or a function of the
        project with arguments given in advance
        (``functools.partial(approx_kl, estimator=args.kl_estimator)``), the
        function itself (``self.kl_fn = _k3``) or a registry's entry for a
        setting (``KL_ESTIMATORS[config.estimator]``)."""
        assert self.cls is not None
        # Read from the class's text first: ``__init__`` is parsed only for
        # an attribute the class assigns once, or on each branch of an ``if``.
        once = selectors.assigned_once(self.module, self.cls, attr)
        if not once and not selectors.assigned_on_branches(self.module, self.cls, attr):
            return None
        init = _constructor(self.cls, attr)
        if init is None:
            return None
        # ``if args.kl_reduction == "token": self.kl_reduce = partial(masked_sum, ...)
        # elif ...``: the branch the settings' defaults take.
        assigned = (
            _init_assignments(init).get(attr, []) if once else self.chosen_in_init(init, attr)
        )
        if len(assigned) == 1 and _trained_parameter(assigned[0]):
            # ``self.log_alpha = nn.Parameter(...)``: a dual variable or a
            # learned coefficient, trained by a loss of its own; its gradient
            # is not the policy's, and kllint does not follow it.
            return ir.Opaque(f"self.{attr} (a trained parameter)")
        if len(assigned) == 1 and isinstance(assigned[0], (cst.Float, cst.Integer)):
            # ``self.gamma = 1.0``: a number the class fixes (a discount, a
            # coefficient), read as written.
            return ir.Const(float(assigned[0].evaluated_value))
        if len(assigned) == 1 and isinstance(assigned[0], (cst.Tuple, cst.List)):
            # ``self.weights = (1.0, -self.args.beta)``: coefficients written
            # out, each with its sign.
            return _coefficients(assigned[0])
        if len(assigned) == 1 and _undiscounted_by_default(init, attr, assigned[0]):
            # ``self.gamma = gamma`` with ``gamma=1.0`` in the signature: no
            # discount unless a caller asks for one.
            return ir.Const(1.0)
        method = self.method_named_in_init(init, assigned)
        if method is not None:
            return method
        if len(assigned) == 1:
            fallback = self.default_settings(init, assigned[0])
            if fallback is not None:
                assigned = [fallback]
        if (
            len(assigned) != 1
            or not isinstance(
                assigned[0],
                (
                    cst.Call,
                    cst.Subscript,
                    cst.Name,
                    cst.Attribute,
                    cst.SimpleString,
                    cst.BooleanOperation,
                ),
            )
            # ``self.kl_estimator = self.args.kl_estimator``: a setting read
            # from another object, asked of only what can pick an estimator.
            or (isinstance(assigned[0], cst.Attribute) and not selectors.names_a_selector(attr))
            # ``self.kl_level = level or "token"``: of locals and literals only.
            or (isinstance(assigned[0], cst.BooleanOperation) and "self" in _names_in(assigned[0]))
            or not _reads_only_settings_of_self(assigned[0])
        ):
            return None
        (value,) = self.eval_in_init(init, assigned)
        if isinstance(value, Py) and isinstance(value.value, str):
            return value
        if (
            isinstance(value, Py)
            and isinstance(value.value, int)
            and not isinstance(value.value, bool)
            and selectors.names_a_selector(attr)
            and roles.weight_role(attr) is not Role.COEFFICIENT
        ):
            # ``self.kl_type = KLType(cfg.kl_type)`` of an ``IntEnum`` field: an
            # int that chooses (a coefficient's number stays open).
            return value
        # ``cfg["kl_penalty"]``, also where ``cfg`` defaults to a settings dict
        # of the module: a run may give any number, so not the default's (a
        # default of 0 would otherwise switch the KL term off for kllint).
        # ``self.algo_cfg = config["algorithm"]`` is a section of the settings,
        # named as one, not a number.
        if isinstance(value, Unknown) and value.default_flag is not None:
            # ``self.use_is = cfg["use_importance_sampling_correction"]``: a
            # feature flag, open, with the default the settings give it.
            return value
        if (
            isinstance(value, Py)
            and isinstance(value.value, bool)
            and isinstance(assigned[0], cst.Subscript)
        ):
            # The same read where ``cfg`` defaults to a settings dict of the
            # module (``cfg: LossConfig = DEFAULT_LOSS_CONFIG``): a run may
            # give another dict, so open too.
            return Unknown(f"self.{attr}", ("self", attr), default_flag=value.value)
        section = bool(set(roles.words(attr)) & selectors.CONFIG_WORDS)
        if not section and (
            (
                isinstance(assigned[0], cst.Subscript)
                and (_from_settings(value) or isinstance(value, ir.Const))
            )
            or (_number_setting(assigned[0]) and _from_settings(value, read_with_default=True))
        ):
            return ir.Atom(Role.COEFFICIENT, f"self.{attr}")
        if isinstance(value, Unknown) and value.module is not None:
            # ``getattr(kl_estimators, f"kl_{cfg.kl.estimator}")``: a function
            # of a module of the project, named by a setting.
            value = self.context.project.function_at(value.module, self.module.path) or value
        if isinstance(value, FuncRef):
            return value
        if isinstance(value, DictVal) and isinstance(
            assigned[0], (cst.Name, cst.Subscript, cst.Attribute)
        ):
            # ``self.algo = self.cfg["algorithm"]`` of a settings dict written
            # in the module: its entries, each a setting with its default.
            # (Not what a call builds: ``{**DEFAULTS, **user_cfg}`` is more
            # than kllint holds of it.)
            return _settings_section(value, f"self.{attr}")
        return None

    def default_settings(
        self, init: cst.FunctionDef, value: cst.BaseExpression
    ) -> cst.BaseExpression | None:
        """``cfg if cfg is not None else DEFAULT_CFG`` with ``cfg=None`` in
        the signature and no construction in the package passing it: the
        module's settings, ``DEFAULT_CFG``."""
        found = _given_or_fallback(value)
        if found is None or self.cls is None:
            return None
        given, fallback = found
        param = next((p for p in named_params(init) if p.name.value == given), None)
        if (
            param is None
            or not _defaults_to_none(param)
            or not isinstance(fallback, cst.Name)
            or fallback.value not in self.module.constants
            or self.context.project.builds_passing(self.context.fs_path, self.cls.name, given)
        ):
            return None
        return fallback

    def method_named_in_init(
        self, init: cst.FunctionDef, assigned: list[cst.BaseExpression]
    ) -> FuncRef | None:
        """``self._kl_fn = getattr(self, f"_kl_{_slug(config.kl_type)}")``: the
        method of the class the settings name."""
        if not (
            len(assigned) == 1
            and isinstance(assigned[0], cst.Call)
            and isinstance(assigned[0].func, cst.Name)
            and assigned[0].func.value == "getattr"
            and len(assigned[0].args) == 2
            and isinstance(assigned[0].args[0].value, cst.Name)
            and assigned[0].args[0].value.value == "self"
            and self.self_class is not None
        ):
            return None
        name_expr = assigned[0].args[1].value
        if not _reads_only_settings_of_self(name_expr):
            return None
        (name,) = self.eval_in_init(init, [name_expr])
        if not (isinstance(name, Py) and isinstance(name.value, str)):
            return None
        method = self.context.project.method(*self.self_class, name.value)
        return method if isinstance(method, FuncRef) else None

    def eval_in_init(
        self, init: cst.FunctionDef, expressions: Sequence[cst.BaseExpression]
    ) -> list[Value]:
        """Expressions of ``__init__`` as it sees them: its parameters are
        unknown, but their annotations (``config: PPOActorConfig``) and the
        package's settings still give defaults; so does a selector's own
        default (``kl_estimator: str = "k1"``) where no construction in the
        package passes that parameter."""
        env: dict[str, Value] = {}
        for param in named_params(init):
            if (
                isinstance(param.default, cst.Name)
                and param.default.value[:1].isupper()
                and param.default.value not in ("None", "True", "False")
            ):
                # ``cfg: MasterConfig = DEFAULT_CONFIG``: the module's settings.
                env[param.name.value] = self.eval(param.default)
                continue
            fallback = _fallback_when_not_given(init, param)
            if (
                fallback is not None
                and self.cls is not None
                and not self.context.project.builds_passing(
                    self.context.fs_path, self.cls.name, param.name.value
                )
            ):
                # ``cfg = cfg or default_loss_config()`` with ``cfg=None`` and no
                # construction in the package passing it: the module's settings.
                env[param.name.value] = self.eval(fallback)
                continue
            if self.cls is None or (
                param.default is not None and not selectors.is_selector_literal(param.default)
            ):
                continue
            name = param.name.value
            if param.default is None and not selectors.names_a_selector(name):
                continue  # only a selector is handed down (and scanning for it costs)
            if not self.context.project.builds_passing(self.context.fs_path, self.cls.name, name):
                if param.default is not None:
                    env[name] = self.eval(param.default)
                continue
            # ``GRPOLoss(kl_estimator=args.kl_estimator)``: the package's one
            # default for the setting of that name, handed down.
            passed = selectors.package_default(self.context.project, self.context.fs_path, name)
            if passed is not None:
                env[name] = passed
        saved = self.env, self.function_node
        self.env, self.function_node = env, init
        try:
            # ``lc = cfg["loss_fn"]`` before ``KL_LOSSES[lc["kl_loss"]]()``:
            # the locals the expressions read, as ``__init__`` set them.
            read = set().union(*(_names_in(e) for e in expressions))
            for name, value in _init_locals(init, read, known=set(env)):
                env[name] = self.eval(value)
            return [self.eval(expression) for expression in expressions]
        finally:
            self.env, self.function_node = saved

    def instantiate(
        self,
        cls: ClassInfo,
        module: ModuleInfo,
        call: cst.Call,
        evaluated: Sequence[Value] | None = None,
    ) -> Instance:
        raise NotImplementedError

    def callable_of_type(self, name: str, fn: cst.FunctionDef) -> Instance | None:
        raise NotImplementedError

    def eval_subscript(self, expr: cst.Subscript) -> Value:
        base = self.eval(expr.value)
        if _reversed_along_time(expr) and isinstance(base, (ir.Node, Flipped)):
            # ``np.cumsum(log_ratio[::-1])[::-1]``: NumPy's flip of the last
            # axis (torch has no negative step), so a reward-to-go.
            return base.node if isinstance(base, Flipped) else Flipped(base)
        if _picks_tokens(expr):
            # ``logp[torch.arange(T), ids[0, P:]]``: each position's sampled
            # token, as ``gather`` picks it.
            if isinstance(base, Unknown) and base.distribution:
                return replace(base, text=code(expr), distribution=False)
            if has_distribution(base):
                return self.lift1(base, lowering.to_token_level)
        key_value: Value | None = None
        index = expr.slice[0].slice if len(expr.slice) == 1 else None
        options = [v for _, v in base.options] if isinstance(base, Choice) else [base]
        if any(_running_sum(v) is not None for v in options) and (
            _last_column(expr) or (isinstance(index, cst.Index) and _segment_ends(index.value))
        ):
            # ``running[:, -1:]`` of ``log_ratio.cumsum(dim=1)``, ``csum[last_idx]``
            # over packed tokens: the running sum at each sequence's last
            # token, its total (``running[:, -1:] - running + x`` is then the
            # KL still to come; ``csum[last_idx][seg_ids]`` spreads it back
            # over the sequence's tokens). On each path that holds one.
            origin = self.origin(expr)

            def total_of(node: ir.Node) -> ir.Node:
                running = _running_sum(node)
                if running is None:
                    return node
                total = ir.Reduce("sum", ir.Axis.TIME, running.arg, origin=origin)
                return total if running is node else ir.detach(total)

            return self.lift1(base, total_of)
        if len(expr.slice) > 1:
            nested = string_key(expr)
            key_value = Py(nested) if nested is not None else None
        if isinstance(index, cst.Index):
            key_value = self.eval(index.value)
            if (
                isinstance(base, DictVal)
                and isinstance(key_value, Unknown)
                and any(k != shown_key(k) for k in base.items)
            ):
                # ``KL_ESTIMATORS[config.kl_estimator]`` keyed by ``IntEnum``
                # members: an int setting used as a key is a selector too.
                key_value = self.index_default(index.value) or key_value
        held = dict_key(key_value.value) if isinstance(key_value, Py) else None
        if isinstance(base, DictVal) and held is not None:
            if held not in base.items:
                self.missing_keys += 1
            return base.items.get(held, Unknown(code(expr), (str(shown_key(held)),)))
        if (
            isinstance(base, DictVal)
            and base.items
            and key_value is not None
            and not isinstance(key_value, Py)
        ):
            # A dispatch table indexed by a selector kllint cannot resolve.
            label = full_code(expr.slice[0].slice)
            return choice(
                [(f"{label} == {shown_key(key)!r}", item) for key, item in base.items.items()]
            )
        if isinstance(base, Seq):
            if isinstance(key_value, Unknown) and isinstance(expr.slice[0].slice, cst.Index):
                key_value = self.index_default(expr.slice[0].slice.value) or key_value
            return self.index_sequence(expr, base, key_value)
        if isinstance(base, Unknown):
            key = (
                key_value.value
                if isinstance(key_value, Py) and isinstance(key_value.value, str)
                else None
            )
            written = self.context.read(base, key) if key is not None else None
            if written is not None:
                return written
            if key is not None:
                # ``config["actor"]["kl_loss_type"]``: a dict config is read
                # like ``config.actor.kl_loss_type``.
                default = self.setting_default(base, key)
                if default is not None and isinstance(default.value, bool):
                    entry = self.entry(base, key, code(expr), per_token=False)
                    if isinstance(entry, Unknown):
                        return replace(entry, default_flag=default.value)
                    return entry
                if default is not None:
                    return default
                weight = self.weight_setting(base, key, expr)
                if weight is not None:
                    return weight
            # Slicing keeps what a tensor is; a string key names what it holds.
            return self.entry(base, key, code(expr), per_token=_cut_along_time(expr, base))
        if (
            isinstance(base, ir.CumSum)
            and isinstance(index, cst.Index)
            and isinstance(index.value, cst.BinaryOperation)
        ):
            # ``csum[cu_seqlens[1:] - 1]``: a running sum read at positions the
            # code computes (each packed segment's last token), no longer each
            # token's running sum; what it holds is not a value kllint follows.
            # (``returns[mb]``, rows picked by a slice or an index, keeps it.)
            return ir.Opaque("a running sum read at computed positions")
        if isinstance(base, (ir.Node, Choice, Flipped, Grouped)):
            return base  # slicing a tensor keeps what it is
        return Unknown(code(expr), ("subscript",))

    @staticmethod
    def entry(base: Unknown, key: str | None, text: str, *, per_token: bool = False) -> Unknown:
        """``batch["ref_logprobs"]`` (or ``batch.get("ref_logprobs")``): what
        a container kllint does not hold has under ``key``, named by it, and
        stored rollout data when the container is one."""
        return replace(
            base,
            text=text,
            names=(*base.names, key) if key else base.names,
            stored=base.stored or (not base.call and roles.from_container(base.names)),
            module=None,
            class_name=None,
            per_token=base.per_token or per_token,
        )

    def index_default(self, key: cst.BaseExpression) -> Py | None:
        """``stack[args.kl_estimator]`` with ``kl_estimator: int = 2``: an int
        setting used as an index is a selector; its default picks the item.
        So does a string setting's place in a list of the names
        (``stack[KL_ESTIMATORS.index(args.kl_estimator)]``)."""
        if (
            isinstance(key, cst.Call)
            and isinstance(key.func, cst.Attribute)
            and key.func.attr.value == "index"
            and len(key.args) == 1
        ):
            names = self.eval(key.func.value)
            chosen = self.index_default(key.args[0].value)
            if (
                isinstance(names, Seq)
                and isinstance(chosen, Py)
                and Py(chosen.value) in names.items
                and isinstance(chosen.value, str)
            ):
                return Py(names.items.index(Py(chosen.value)))
            return None
        if not isinstance(key, cst.Attribute):
            return None
        base = self.eval(key.value)
        if not isinstance(base, Unknown):
            return None
        default = selectors.config_default(
            self.context.project,
            self.context.fs_path,
            self.module,
            self.function_node,
            self.cls,
            base,
            key.attr.value,
            index=True,
        )
        if default is not None and self.call_site is not None:
            note = selectors.default_note(key, default)
            if note not in self.call_site.notes:
                self.call_site.notes.append(note)
        return default

    def index_passed_down(self, key: Unknown) -> int | None:
        """``stack[kl_type]`` in a helper its caller gave ``kl_type=args.kl_estimator``:
        the default the package gives that setting picks the item, as it
        does for ``stack[args.kl_estimator]`` written in the caller."""
        if key.call or key.module is not None or len(key.names) < 2:
            return None
        owner = key.names[:-1]
        default = selectors.config_default(
            self.context.project,
            self.context.fs_path,
            self.module,
            None,
            None,
            Unknown(".".join(owner), owner),
            key.names[-1],
            index=True,
        )
        if default is None or not isinstance(default.value, int) or isinstance(default.value, bool):
            return None
        if self.call_site is not None:
            note = selectors.default_note(key.text, default)
            if note not in self.call_site.notes:
                self.call_site.notes.append(note)
        return default.value

    def index_sequence(self, expr: cst.Subscript, base: Seq, key_value: Value | None) -> Value:
        """``pair[0]``; ``steps[t]`` of rows collected in a loop; ``options[i]``
        by an index kllint cannot resolve: one alternative per item."""
        index: int | None = None
        if isinstance(key_value, ir.Const) and float(key_value.value).is_integer():
            index = int(key_value.value)
        elif (
            isinstance(key_value, Py)
            and isinstance(key_value.value, int)
            and not isinstance(key_value.value, bool)
        ):
            index = key_value.value
        if index is None and isinstance(key_value, Unknown):
            index = self.index_passed_down(key_value)
        if index is not None and -len(base.items) <= index < len(base.items):
            return base.items[index]
        if base.appended:
            return base  # ``steps[::-1]``: the same rows, reordered
        if key_value is not None:
            label = full_code(expr.slice[0].slice)
            return choice([(f"{label} == {i}", item) for i, item in enumerate(base.items)])
        return Unknown(code(expr), ("slice",))

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
            flag = self.flag_defaults.pop(id(expr.expression), None)
            if flag is not None:
                self.flag_defaults[id(expr)] = not flag
            return None if inner is None else not inner
        if isinstance(expr, cst.Comparison):
            left = self.eval(expr.left)
            result: bool | None = True
            for target in expr.comparisons:
                right = self.eval(target.comparator)
                left, right = _mode_defaults(target.operator, left, right)
                outcome = compare(target.operator, left, right)
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
        if isinstance(value, Unknown) and value.default_flag is not None:
            self.flag_defaults[id(expr)] = value.default_flag
        return None

    def condition_label(self, test: cst.BaseExpression) -> str:
        return selectors.condition_label(test, in_helper=self.depth > 0)


def _tensor_like(value: Value) -> bool:
    """A tensor expression, or an unknown value named or produced like one (a
    mask, a log-prob, rollout data): never None where the code uses it. A
    choice of such values (an importance weight set on either branch) too."""
    if isinstance(value, ir.Node):
        return True
    if isinstance(value, Choice):
        return all(_tensor_like(option) for _, option in value.options)
    if not isinstance(value, Unknown):
        return False
    if value.logprob_op or value.stored:
        return True
    last = value.names[-1] if value.names else ""
    return roles.weight_role(last) is Role.MASK or roles.is_logprob_name(last)


def _picks_tokens(expr: cst.Subscript) -> bool:
    """An index tensor in the last place of several (``logp[rows, ids]``), not
    a slice, a number or a new axis."""
    if len(expr.slice) < 2 or not isinstance(expr.slice[-1].slice, cst.Index):
        return False
    last = expr.slice[-1].slice.value
    if isinstance(last, (cst.Integer, cst.Ellipsis, cst.UnaryOperation)):
        return False
    return not (isinstance(last, cst.Name) and last.value == "None")


def _cut_along_time(expr: cst.Subscript, base: Unknown) -> bool:
    """``logits[:, prompt_len - 1 : -1]``: logits cut to the response along
    their second axis, time; so is one sample's row (``logits[0, start:-1]``).
    (A classifier head's logits are not cut so.)"""
    if len(expr.slice) < 2 or not any("logits" in roles.words(n) for n in base.names):
        return False
    first, second = expr.slice[0].slice, expr.slice[1].slice
    whole = isinstance(first, cst.Slice) and first.lower is None and first.upper is None
    return (
        (whole or isinstance(first, cst.Index))
        and isinstance(second, cst.Slice)
        and (second.lower is not None or second.upper is not None)
    )


_INIT_ASSIGNMENTS: dict[
    int,
    tuple[
        cst.FunctionDef,
        tuple[dict[str, list[cst.BaseExpression]], dict[str, list[cst.BaseExpression]]],
    ],
] = {}


def _from_settings(value: Value, *, read_with_default: bool = False) -> bool:
    """An entry of a settings mapping ``__init__`` was given (``cfg["beta"]``,
    with ``read_with_default`` also ``cfg.get("beta", 0.01)``), not a tensor:
    read from a name like ``cfg``, ``config``, ``args``."""
    return (
        isinstance(value, Unknown)
        and value.call == read_with_default
        and len(value.names) == 2
        and any(w in selectors.CONFIG_WORDS for w in roles.words(value.names[0]))
    )


def _boundary_difference(expr: cst.BinaryOperation) -> bool:
    """``c[b[1:]] - c[b[:-1]]``, ``c[ends] - c[starts]``: one running sum read
    at the ends and at the starts of the segments a boundary tensor
    (``cu_seqlens``) marks."""
    sides = []
    for side in (expr.left, expr.right):
        if not (
            isinstance(side, cst.Subscript)
            and len(side.slice) == 1
            and isinstance(side.value, cst.Name)
            and isinstance(side.slice[0].slice, cst.Index)
        ):
            return False
        bounds = _before_methods(side.slice[0].slice.value)  # ``cu_seqlens[1:].long()``
        sides.append((side.value.value, bounds))
    (values, ends), (values_again, starts) = sides
    if values != values_again:
        return False
    if isinstance(ends, cst.Subscript) and isinstance(starts, cst.Subscript):
        return full_code(ends.value) == full_code(starts.value) and full_code(ends) != full_code(
            starts
        )
    return (
        isinstance(ends, cst.Name)
        and isinstance(starts, cst.Name)
        and bool(set(roles.words(ends.value)) & _SEGMENT_ENDS)
        and bool(set(roles.words(starts.value)) & _SEGMENT_STARTS)
    )


_SEGMENT_ENDS = frozenset({"end", "ends", "stop", "stops"})
# Reductions that return ``(values, indices)``.
_SELECTIONS = frozenset((n,) for n in ("max", "min", "topk", "sort", "kthvalue", "median", "mode"))


def _running_sum(value: Value) -> ir.CumSum | None:
    """A forward, undiscounted running sum (``torch.cumsum(x, 0)``), detached
    or not."""
    if isinstance(value, ir.Unary) and value.op == "detach":
        value = value.arg
    if isinstance(value, ir.CumSum) and not value.reverse and value.discount is None:
        return value
    return None


def _values_call(iterable: cst.BaseExpression) -> bool:
    """``terms.values()``."""
    return (
        isinstance(iterable, cst.Call)
        and isinstance(iterable.func, cst.Attribute)
        and iterable.func.attr.value == "values"
        and not iterable.args
    )


def _star_source(project: Project, module: ModuleInfo, name: str, depth: int) -> ModuleInfo | None:
    """The module that defines ``name`` for ``module``'s star imports."""
    for star in module.star_imports:
        source = project.resolve_module(star.module, module.path, star.level)
        if source is None or source is module:
            continue
        if name in source.functions or name in source.classes or name in source.constants:
            return source
        if depth > 1 and source.star_imports:
            found = _star_source(project, source, name, depth - 1)
            if found is not None:
                return found
    return None


def _last_column(expr: cst.Subscript) -> bool:
    """``x[:, -1]``, ``x[:, -1:]``, ``x[..., -1:]``: the last position along
    the last axis, every row kept."""
    *rows, last = expr.slice
    if not rows or not all(
        _whole_axis(r)
        or (isinstance(r.slice, cst.Index) and isinstance(r.slice.value, cst.Ellipsis))
        for r in rows
    ):
        return False
    if isinstance(last.slice, cst.Index):
        return int_literal(last.slice.value) == -1
    return (
        isinstance(last.slice, cst.Slice)
        and last.slice.lower is not None
        and int_literal(last.slice.lower) == -1
        and last.slice.upper is None
        and last.slice.step is None
    )


def _segment_ends(index: cst.BaseExpression) -> bool:
    """``last_idx``, ``seq_ends``, ``cu_seqlens[1:] - 1``: the position of each
    packed sequence's last token."""
    index = _before_methods(index)  # ``(cu_seqlens[1:] - 1).long()``
    if isinstance(index, cst.Name):
        return bool(set(roles.words(index.value)) & (_SEGMENT_ENDS | {"last"}))
    if not (
        isinstance(index, cst.BinaryOperation)
        and isinstance(index.operator, cst.Subtract)
        and int_literal(index.right) == 1
    ):
        return False
    ends = _before_methods(index.left)  # ``cu_seqlens[1:].long() - 1``
    return isinstance(ends, cst.Subscript) and full_code(ends).endswith("[1:]")


def _before_methods(expr: cst.BaseExpression) -> cst.BaseExpression:
    """``x`` of ``x.long().cpu()``: what the chain of method calls is made on."""
    while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute):
        expr = expr.func.value
    return expr


_SEGMENT_STARTS = frozenset({"start", "starts", "begin", "begins"})


def _number_setting(expr: cst.BaseExpression) -> bool:
    """``cfg.get("reference_policy_kl_penalty", 0.01)``: a number read from the settings."""
    return (
        _setting_read(expr)
        and isinstance(expr, cst.Call)
        and len(expr.args) == 2
        and isinstance(expr.args[1].value, (cst.Float, cst.Integer))
    )


# Methods frameworks call once to set an object up, after ``__init__``
# (oat's ``_init``, Lightning's ``setup``, a dataclass's ``__post_init__``).
_SETUP_METHODS = ("__init__", "__post_init__", "_init", "setup", "_setup")


def _constructor(cls: ClassInfo, attr: str) -> cst.FunctionDef | None:
    """The method that sets ``self.attr`` up: ``__init__``, or a setup hook
    where ``__init__`` does not assign it."""
    # Also a named setup step (``_setup_loss``, ``_init_kl``) that ``__init__``
    # hands part of the set-up to.
    for name in (*_SETUP_METHODS, *_setup_steps(cls)):
        method = cls.methods.get(name)
        if method is not None and isinstance(method.body, cst.IndentedBlock):
            if attr in _init_assignments(method) or attr in _branch_assignments(method):
                return method
    return None


def _setup_steps(cls: ClassInfo) -> list[str]:
    cached = _SETUP_STEPS.get(id(cls))
    if cached is None or cached[0] is not cls:
        steps = sorted(n for n in cls.methods if n not in _SETUP_METHODS and _SETUP_STEP.match(n))
        cached = _SETUP_STEPS[id(cls)] = (cls, steps)
    return cached[1]


_SETUP_STEP = re.compile(r"_?(setup|init)_\w+$")
_SETUP_STEPS: dict[int, tuple[ClassInfo, list[str]]] = {}


def _init_assignments(init: cst.FunctionDef) -> dict[str, list[cst.BaseExpression]]:
    """``self.name = value`` statements at the top level of ``__init__``."""
    return _top_level_assignments(init)[0]


def _fallback_when_not_given(init: cst.FunctionDef, param: cst.Param) -> cst.BaseExpression | None:
    """``X`` of ``cfg = cfg or X`` (or ``X if cfg is None else cfg``), the one
    assignment ``__init__`` makes to a parameter that defaults to None."""
    if not _defaults_to_none(param):
        return None
    values = _local_assignments(init).get(param.name.value, [])
    found = _given_or_fallback(values[0]) if len(values) == 1 else None
    if found is None or found[0] != param.name.value:
        return None
    # Settings written elsewhere (``DEFAULT_CFG``, ``default_loss_config()``);
    # ``cfg or {}`` leaves each read to its own default.
    fallback = found[1]
    if isinstance(fallback, cst.Call) and isinstance(fallback.func, cst.Name):
        return None if fallback.func.value in ("dict", "OrderedDict") else fallback
    return fallback if isinstance(fallback, (cst.Name, cst.Call)) else None


def _defaults_to_none(param: cst.Param) -> bool:
    return isinstance(param.default, cst.Name) and param.default.value == "None"


def _given_or_fallback(value: cst.BaseExpression) -> tuple[str, cst.BaseExpression] | None:
    """``cfg or X``, ``cfg if cfg is not None else X`` (``X if cfg is None
    else cfg``): the name given and the fallback used without it."""
    if (
        isinstance(value, cst.BooleanOperation)
        and isinstance(value.operator, cst.Or)
        and isinstance(value.left, cst.Name)
    ):
        return value.left.value, value.right
    if not (
        isinstance(value, cst.IfExp)
        and isinstance(value.test, cst.Comparison)
        and len(value.test.comparisons) == 1
        and isinstance(value.test.left, cst.Name)
        and isinstance(value.test.comparisons[0].comparator, cst.Name)
        and value.test.comparisons[0].comparator.value == "None"
        and isinstance(value.test.comparisons[0].operator, (cst.IsNot, cst.Is))
    ):
        return None
    is_none = isinstance(value.test.comparisons[0].operator, cst.Is)
    return value.test.left.value, value.body if is_none else value.orelse


def _local_assignments(init: cst.FunctionDef) -> dict[str, list[cst.BaseExpression]]:
    """``name = value`` statements at the top level of ``__init__``, by name."""
    return _top_level_assignments(init)[1]


def _top_level_assignments(
    init: cst.FunctionDef,
) -> tuple[dict[str, list[cst.BaseExpression]], dict[str, list[cst.BaseExpression]]]:
    """The assignments at the top level of ``__init__``, read once: to
    ``self``'s attributes (also annotated, ``self.shaper: Shaper = ...``)
    and to local names."""
    cached = _INIT_ASSIGNMENTS.get(id(init))
    if cached is not None and cached[0] is init:
        return cached[1]
    attributes: dict[str, list[cst.BaseExpression]] = {}
    local: dict[str, list[cst.BaseExpression]] = {}
    for statement in init.body.body if isinstance(init.body, cst.IndentedBlock) else []:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if isinstance(small, cst.Assign) and len(small.targets) == 1:
                pairs = _unpacked(small.targets[0].target, small.value)
            elif isinstance(small, cst.AnnAssign) and small.value is not None:
                pairs = [(small.target, small.value)]
            else:
                continue
            for target, value in pairs:
                if isinstance(target, cst.Name) and not isinstance(small, cst.AnnAssign):
                    local.setdefault(target.value, []).append(value)
                elif (
                    isinstance(target, cst.Attribute)
                    and isinstance(target.value, cst.Name)
                    and target.value.value == "self"
                ):
                    attributes.setdefault(target.attr.value, []).append(value)
    _INIT_ASSIGNMENTS[id(init)] = (init, (attributes, local))
    return attributes, local


def _unpacked(
    target: cst.BaseAssignTargetExpression, value: cst.BaseExpression
) -> list[tuple[cst.BaseExpression, cst.BaseExpression]]:
    """``self.kl_estimator, _, level = spec.partition("@")``: each target
    with the element of the value it takes (``spec.partition("@")[0]``)."""
    if not isinstance(target, (cst.Tuple, cst.List)):
        return [(target, value)]
    if any(isinstance(e, cst.StarredElement) for e in target.elements):
        return []
    if isinstance(value, (cst.Tuple, cst.List)):
        # ``self.cfg, self.policy = cfg, policy``: each its own assignment.
        if len(value.elements) != len(target.elements) or any(
            isinstance(e, cst.StarredElement) for e in value.elements
        ):
            return []
        return [(t.value, v.value) for t, v in zip(target.elements, value.elements)]
    return [
        (
            element.value,
            cst.Subscript(
                value=value, slice=[cst.SubscriptElement(cst.Index(cst.Integer(str(i))))]
            ),
        )
        for i, element in enumerate(target.elements)
    ]


# Names of a return's discount and of GAE's lambda.


def _undiscounted_by_default(
    init: cst.FunctionDef, attr: str, assigned: cst.BaseExpression
) -> bool:
    """``self.lam = lam`` where ``__init__`` has ``lam=1.0``: a discount whose
    default is 1."""
    if not (isinstance(assigned, cst.Name) and set(roles.words(attr)) & roles.DISCOUNT_WORDS):
        return False
    for param in named_params(init):
        if param.name.value == assigned.value:
            return (
                isinstance(param.default, (cst.Float, cst.Integer))
                and float(param.default.evaluated_value) == 1.0
            )
    return False


def _branch_assignments(
    init: cst.FunctionDef,
) -> dict[str, list[list[tuple[cst.BaseExpression | None, cst.BaseExpression | None]]]]:
    """For each ``self.attr`` that every branch of an ``if``/``elif``/``else``
    at the top level of ``__init__`` sets (a branch may raise instead: None),
    the branches as (condition, value), ``else`` with condition None."""
    cached = _BRANCH_ASSIGNMENTS.get(id(init))
    if cached is not None and cached[0] is init:
        return cached[1]
    table: dict[str, list[list[tuple[cst.BaseExpression | None, cst.BaseExpression | None]]]] = {}
    for statement in init.body.body if isinstance(init.body, cst.IndentedBlock) else []:
        if not isinstance(statement, cst.If):
            continue
        branches: list[tuple[cst.BaseExpression | None, cst.BaseSuite]] = []
        node: cst.If | cst.Else | None = statement
        while node is not None:
            if isinstance(node, cst.If):
                branches.append((node.test, node.body))
                node = node.orelse
            else:
                branches.append((None, node.body))
                node = None
        sets = [_branch_sets(body) for _, body in branches]
        raising = [s is None for s in sets]
        common = (
            set.intersection(*(set(s) for s in sets if s is not None))
            if not all(raising)
            else set()
        )
        for attr in common:
            table.setdefault(attr, []).append(
                [(test, None if s is None else s[attr]) for (test, _), s in zip(branches, sets)]
            )
    _BRANCH_ASSIGNMENTS[id(init)] = (init, table)
    return table


def _branch_sets(body: cst.BaseSuite) -> dict[str, cst.BaseExpression] | None:
    """``self.x = value`` lines of one branch (each set once), or None for a
    branch that only raises."""
    statements = body.body if isinstance(body, cst.IndentedBlock) else []
    sets: dict[str, cst.BaseExpression] = {}
    for statement in statements:
        if not isinstance(statement, cst.SimpleStatementLine):
            return {}
        for small in statement.body:
            if isinstance(small, cst.Raise):
                return None
            if (
                isinstance(small, cst.Assign)
                and len(small.targets) == 1
                and isinstance(small.targets[0].target, cst.Attribute)
                and isinstance(small.targets[0].target.value, cst.Name)
                and small.targets[0].target.value.value == "self"
            ):
                attr = small.targets[0].target.attr.value
                if attr in sets:
                    return {}
                sets[attr] = small.value
    return sets


_BRANCH_ASSIGNMENTS: dict[
    int,
    tuple[
        cst.FunctionDef,
        dict[str, list[list[tuple[cst.BaseExpression | None, cst.BaseExpression | None]]]],
    ],
] = {}


_CLASS_FUNCTIONS: dict[
    tuple[int, str], tuple[ClassInfo, tuple[cst.BaseExpression, ModuleInfo] | None]
] = {}
_DOTTED_NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")


def _init_locals(
    init: cst.FunctionDef, read: set[str], known: set[str]
) -> list[tuple[str, cst.BaseExpression]]:
    """The local names ``__init__`` assigns once at its top level that
    ``read`` depends on, with their values, in the order written; only those
    whose parameters are ``known`` (a default read): ``cfg = dict(cfg_arg or
    {})`` of a parameter the caller gives stays what the parameter is."""
    assigned = _local_assignments(init)
    if not read & assigned.keys():
        return []
    wanted: set[str] = set()
    frontier = read & assigned.keys()
    while frontier:
        wanted |= frontier
        frontier = {
            n for name in frontier for n in _names_in(assigned[name][0]) if n in assigned
        } - wanted
    # A parameter given a new value (``config = {**DEFAULTS, **(config or {})}``)
    # is still the caller's: left to what the parameter is.
    params = {param.name.value for param in named_params(init)}
    unknown = (params - known) | {name for name, values in assigned.items() if len(values) > 1}
    ordered = []
    for name in assigned:
        if name in params or name in unknown or _names_in(assigned[name][0]) & unknown:
            unknown.add(name)  # and so is what is computed from it
        elif name in wanted:
            ordered.append(name)
    return [(name, assigned[name][0]) for name in ordered]


def _mode_defaults(operator: cst.BaseCompOp, left: Value, right: Value) -> tuple[Value, Value]:
    """``beta == 1`` with ``beta: float = 1.0`` in the config class: a number
    compared for equality with another that is not zero picks a mode (GKD's
    ``beta`` of 0, 1 or a mix), like a string selector, so its default
    decides. Against zero it switches a term off (``if self.beta != 0.0``),
    and ordered it is a threshold: a default there must not hide the term
    users turn on, so those stay open; unless the default turns the term on
    (``if cfg.kl_discount_factor > 0`` with a default of 1.0, ``if
    self.beta != 0.0`` with 0.04): the path a default run takes, which a
    zero default would leave open."""

    def nonzero(v: Value) -> bool:
        number = v.value if isinstance(v, (Py, ir.Const)) else None
        return isinstance(number, (int, float)) and not isinstance(number, bool) and number != 0

    def default(v: Value) -> Value:
        if isinstance(v, ir.Atom) and v.role is Role.COEFFICIENT and v.default is not None:
            return Py(v.default[0], source=v.default[1])
        return v

    if isinstance(operator, (cst.GreaterThan, cst.LessThan)):
        above = left if isinstance(operator, cst.GreaterThan) else right
        zero = right if above is left else left
        if isinstance(zero, (Py, ir.Const)) and zero.value == 0:
            positive = default(above)
            if isinstance(positive, Py) and nonzero(positive) and positive.value > 0:  # type: ignore[operator]
                return (positive, zero) if above is left else (zero, positive)
        return left, right
    if not isinstance(operator, (cst.Equal, cst.NotEqual)):
        return left, right

    if nonzero(right):
        return default(left), right
    if nonzero(left):
        return left, default(right)
    # ``if self.beta != 0.0`` with a default of 0.04: the term is on in a
    # default run (a zero default stays open).
    for side, other in ((left, right), (right, left)):
        if isinstance(other, (Py, ir.Const)) and other.value == 0 and nonzero(default(side)):
            return (default(side), other) if side is left else (other, default(side))
    return left, right


# ``__name__`` is this module's dotted name (for ``importlib.import_module``);
# compared with ``"__main__"`` it stays open: a script's main block runs when
# the file is run, and that is the code path kllint judges.
MODULE_NAME = "__name__"


def compare(operator: cst.BaseCompOp, left: Value, right: Value) -> bool | None:
    if any(isinstance(v, Py) and v.source == MODULE_NAME for v in (left, right)):
        return None

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
        # ``kl_type is KLType.K1``: Enum members stand for their values (a
        # string, or a number for an ``IntEnum``), and one value is one member.
        if isinstance(operator, (cst.Is, cst.IsNot)):
            same: bool | None = None
            if (
                _member_value(lv)
                and _member_value(rv)
                and isinstance(lv, str) == isinstance(rv, str)
            ):
                same = lv == rv
            elif rv is None or isinstance(rv, bool):
                same = lv is rv
            if same is None:
                return None
            return same if isinstance(operator, cst.Is) else not same
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


def _member_value(value: object) -> bool:
    return isinstance(value, (str, int, float)) and not isinstance(value, bool)


_HUGE = 1e100

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


def _names_in(expr: cst.BaseExpression) -> frozenset[str]:
    """Every name an expression reads. Walked by hand: a LibCST visitor
    rebuilds the tree it visits. Asked for each ``self.x`` read, so kept
    (with the node, whose id is not reused while it is a key)."""
    cached = _NAMES_IN.get(id(expr))
    if cached is not None and cached[0] is expr:
        return cached[1]
    names = frozenset(n.value for n in descendants(expr) if isinstance(n, cst.Name))
    _NAMES_IN[id(expr)] = (expr, names)
    return names


_NAMES_IN: dict[int, tuple[cst.BaseExpression, frozenset[str]]] = {}


def _reads_only_settings_of_self(expr: cst.BaseExpression) -> bool:
    """``self.config["kl_loss_type"]``, ``KLType(cfg.kl_type)``: of the
    object being built, an expression reads at most its settings (an
    attribute named like ``config``, or like a selector), which ``__init__``
    set before."""
    if "self" not in _names_in(expr):
        return True
    stack: list[cst.CSTNode] = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name):
            if node.value.value == "self":
                # ``KL_ESTIMATORS[self.kl_estimator]``: a selector ``__init__``
                # set from the settings a line before is one of them.
                if not (
                    set(roles.words(node.attr.value)) & selectors.CONFIG_WORDS
                    or selectors.names_a_selector(node.attr.value)
                ):
                    return False
                continue
        elif isinstance(node, cst.Name) and node.value == "self":
            return False  # ``self`` itself, passed along
        stack.extend(children(node))
    return True


def _renamed_log_prob(value: Value, name: str) -> Value:
    """``value`` with its one log-prob atom named ``name``; as it is otherwise."""
    if not isinstance(value, ir.Node):
        return value
    atoms = [
        a for a in value.atoms() if a.role in (Role.POLICY_LOGP, Role.OLD_LOGP, Role.REFERENCE_LOGP)
    ]
    if len(atoms) != 1:
        return value
    return ir.substitute(value, {id(atoms[0]): replace(atoms[0], name=name)})


def _normaliser_of(right: cst.BaseExpression, left: cst.BaseExpression) -> bool:
    """``torch.logsumexp(z, ...)`` taken of the very expression ``z``."""
    return (
        isinstance(right, cst.Call)
        and (dotted_name(right.func) or "").rpartition(".")[2] == "logsumexp"
        and bool(right.args)
        and right.args[0].keyword is None
        and code(right.args[0].value) == code(left)
    )


_EVALUATORS: dict[type, str] = {
    cst.Name: "eval_name",
    cst.Integer: "number",
    cst.Float: "number",
    cst.SimpleString: "eval_string",
    cst.ConcatenatedString: "eval_string",
    cst.FormattedString: "eval_formatted_string",
    cst.UnaryOperation: "eval_unary",
    cst.BinaryOperation: "eval_binary",
    cst.Comparison: "eval_condition",
    cst.BooleanOperation: "eval_condition",
    cst.IfExp: "eval_if_expression",
    cst.Tuple: "eval_display",
    cst.List: "eval_display",
    cst.Dict: "eval_display",
    cst.Attribute: "eval_attribute",
    cst.Subscript: "eval_subscript",
    cst.Call: "eval_call",
    cst.Await: "eval_await",
    cst.Yield: "eval_yield",
    cst.NamedExpr: "eval_named_expression",
    cst.Lambda: "eval_lambda",
    cst.DictComp: "eval_dict_comprehension",
    cst.ListComp: "eval_comprehension",
    cst.GeneratorExp: "eval_comprehension",
}


def _flattened(expr: cst.BaseExpression) -> bool:
    """``x.reshape(-1)``, ``x.view(-1)``, ``x.flatten()``: one vector of every element."""
    if not (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute)):
        return False
    method = expr.func.attr.value
    if method == "flatten":
        return not expr.args
    return (
        method in ("reshape", "view")
        and len(expr.args) == 1
        and int_literal(expr.args[0].value) == -1
    )


def _setting_read(expr: cst.BaseExpression) -> bool:
    """``config.get("kl_clip", 20.0)``, ``cfg["kl_clip"]``: a number or a
    choice read from the settings, which carries no KL term."""
    if isinstance(expr, cst.Subscript):
        return len(expr.slice) == 1 and isinstance(
            getattr(expr.slice[0].slice, "value", None), cst.SimpleString
        )
    return (
        isinstance(expr, cst.Call)
        and isinstance(expr.func, cst.Attribute)
        and expr.func.attr.value == "get"
        and bool(expr.args)
        and isinstance(expr.args[0].value, cst.SimpleString)
    )


# Ops that pick the sampled tokens' entries out of the vocabulary axis.
_TOKEN_PICKERS = frozenset({"gather", "take_along_dim", "index_select", "squeeze"})


def _gathers_tokens(expr: cst.BaseExpression) -> bool:
    """``logits.gather(-1, ids).squeeze(-1)``, ``logits[rows, ids]``: the
    sampled tokens' entries, not the whole vocabulary (``logits[..., s:e]``)."""
    for node in (expr, *descendants(expr)):
        if isinstance(node, cst.Call):
            name = dotted_name(node.func) or (
                node.func.attr.value if isinstance(node.func, cst.Attribute) else ""
            )
            if name.rpartition(".")[2] in _TOKEN_PICKERS:
                return True
        if isinstance(node, cst.Subscript) and _picks_tokens(node):
            return True
    return False


def _makes_a_new_tensor(element: cst.BaseExpression) -> bool:
    name = dotted_name(element.func) if isinstance(element, cst.Call) else None
    return (
        name is not None
        and name.startswith("torch.")
        and name.rpartition(".")[2] in lowering.NEW_TENSORS | ir.CONSTANT_TENSORS
    )


def _sum_from_each_step(expr: cst.ListComp | cst.GeneratorExp) -> cst.BaseExpression | None:
    """``x[:, t:].sum(-1) for t in range(T)``: the tensor whose sum from each
    step ``t`` to the end the comprehension takes, else None."""
    loop = expr.for_in
    element = expr.elt
    if (
        loop.inner_for_in is not None
        or not isinstance(loop.target, cst.Name)
        or not (isinstance(loop.iter, cst.Call) and dotted_name(loop.iter.func) == "range")
        or not isinstance(element, cst.Call)
        or not isinstance(element.func, cst.Attribute)
        or element.func.attr.value != "sum"
        or len(element.args) != 1
        or not isinstance(element.func.value, cst.Subscript)
    ):
        return None
    step = loop.target.value
    last_axis = int_literal(element.args[0].value) in (1, -1)
    sliced = element.func.value
    slices = [e.slice for e in sliced.slice]
    if not (last_axis and len(slices) == 2 and all(isinstance(s, cst.Slice) for s in slices)):
        return None
    batch, time = slices
    assert isinstance(batch, cst.Slice) and isinstance(time, cst.Slice)
    whole_batch = batch.lower is None and batch.upper is None and batch.step is None
    from_step = (
        isinstance(time.lower, cst.Name)
        and time.lower.value == step
        and time.upper is None
        and time.step is None
    )
    return sliced.value if whole_batch and from_step else None


def _settings_section(section: DictVal, shown: str) -> DictVal:
    """A settings dict's entries as settings: its strings and flags pick as
    their defaults do; a coefficient's number (other than 1, which scales
    nothing) is a coefficient a run may set to any value, with its default
    for comparisons that pick a mode, as for a config class's field."""
    items: dict[str, Value] = {}
    for key, entry in section.items.items():
        where = f"{shown}[{key!r}]"
        if isinstance(entry, DictVal):
            items[key] = _settings_section(entry, where)
        elif (
            isinstance(entry, ir.Const)
            and entry.value != 1.0
            and roles.weight_role(key) is Role.COEFFICIENT
        ):
            items[key] = ir.Atom(Role.COEFFICIENT, where, default=(entry.value, where))
        else:
            items[key] = entry
    return DictVal(items, section.positional)


def _trained_parameter(value: cst.BaseExpression) -> bool:
    """``nn.Parameter(...)``, ``torch.zeros((), requires_grad=True)``."""
    if not isinstance(value, cst.Call):
        return False
    if (dotted_name(value.func) or "").rpartition(".")[2] == "Parameter":
        return True
    return any(
        a.keyword is not None
        and a.keyword.value == "requires_grad"
        and isinstance(a.value, cst.Name)
        and a.value.value == "True"
        for a in value.args
    )


def _coefficients(written: cst.Tuple | cst.List) -> Seq | None:
    """Numbers and settings read off ``self`` (``(1.0, -self.args.beta)``),
    each a coefficient with its sign; None for anything else."""
    items: list[Value] = []
    for element in written.elements:
        value, negated = element.value, False
        if isinstance(value, cst.UnaryOperation) and isinstance(value.operator, cst.Minus):
            value, negated = value.expression, True
        if isinstance(value, (cst.Float, cst.Integer)):
            number: ir.Node = ir.Const(float(value.evaluated_value))
        elif isinstance(value, cst.Attribute) and (dotted_name(value) or "").startswith("self."):
            number = ir.Atom(Role.COEFFICIENT, code(value))
        else:
            return None
        items.append(ir.neg(number) if negated else number)
    return Seq(items) if len(items) > 1 else None


def _loops(loop: cst.CompFor | None) -> Iterator[cst.CompFor]:
    while loop is not None:
        yield loop
        loop = loop.inner_for_in


def _reversed_along_time(expr: cst.Subscript) -> bool:
    """``x[::-1]``, ``x[:, ::-1]``: the last axis read backwards, the others whole."""
    *others, last = expr.slice
    piece = last.slice
    step = piece.step if isinstance(piece, cst.Slice) else None
    backwards = (
        isinstance(piece, cst.Slice)
        and piece.lower is None
        and piece.upper is None
        and isinstance(step, cst.UnaryOperation)
        and isinstance(step.operator, cst.Minus)
        and isinstance(step.expression, cst.Integer)
        and step.expression.value == "1"
    )
    return backwards and all(map(_whole_axis, others))


def _whole_axis(element: cst.SubscriptElement) -> bool:
    """``:``, every position of an axis."""
    piece = element.slice
    return (
        isinstance(piece, cst.Slice)
        and piece.lower is None
        and piece.upper is None
        and piece.step is None
    )
