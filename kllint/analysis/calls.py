"""Calls: of helpers of the project (inlined with their arguments bound),
of torch (lowered by the torch vocabulary), of methods on tensors and on
values kllint cannot compute, of ``.backward()`` (a sink)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

import libcst as cst

from kllint.analysis import ir, library, lowering, roles, selectors, sinks
from kllint.analysis.expressions import Expressions
from kllint.analysis.ir import Role
from kllint.analysis.lowering import (
    AGGREGATORS,
    DETACHING,
    IN_PLACE,
    LOGPROB_OPS,
    MUTATING,
    SPLITS,
    TENSOR_IDENTITY,
    UNARY,
    split_tensor,
)
from kllint.analysis.module import (
    DIFFERENTIATORS,
    ClassInfo,
    ModuleInfo,
    dotted_name,
)
from kllint.analysis.project import Project, dotted_module_name
from kllint.analysis.syntax import assigned_names, chain_names, code, full_code, int_literal
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
    has_distribution,
)

# Methods of ``str`` that a selector goes through before it is compared.
STRING_METHODS = frozenset(
    {
        "rstrip",
        "lstrip",
        "strip",
        "lower",
        "upper",
        "casefold",
        "removeprefix",
        "removesuffix",
        "replace",
        "endswith",
        "startswith",
        "split",
        "rsplit",
        "partition",
        "rpartition",
        "count",
        "find",
    }
)


class Calls(Expressions):
    def eval_call(self, call: cst.Call) -> Value:
        func = call.func
        args = [a for a in call.args if a.keyword is None and a.star == ""]
        kwargs = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
        setting = selectors.read_with_a_default(call)
        if setting is not None:
            return setting
        if isinstance(func, cst.Attribute):
            return self.eval_method_call(call, func, args, kwargs)
        differentiated = self.differentiated(func)
        if differentiated is not None:
            # ``grad(loss_fn)(params, model, batch)``: ``loss_fn`` runs on the
            # arguments and what it returns is differentiated, a loss.
            value = self.inline(differentiated, call)
            description = f"`{code(call)}` (torch.func differentiates it)"
            if sinks.names_an_objective(differentiated.name):
                # ``grad(objective)``: a step up the gradient, as its name says.
                value = self.lift1(value, ir.neg)
                description += ", maximised (named as an objective)"
            self.add_sink(value, description, True, call, backward=True)
            return Unknown(code(call), ("gradients",), call=True, detached=True)
        return self.call_value(self.eval(func), call, args, kwargs)

    def differentiated(self, func: cst.BaseExpression) -> FuncRef | None:
        """The function ``torch.func.grad(f)`` (or ``grad_and_value``) wraps."""
        if not (isinstance(func, cst.Call) and func.args and func.args[0].keyword is None):
            return None
        name = dotted_name(func.func) or ""
        head, _, last = name.rpartition(".")
        if last not in DIFFERENTIATORS:
            return None
        imported = self.module.imports.get(name) if not head else None
        source = imported.module if imported is not None else head
        if not source.startswith(lowering.FUNCTIONAL_MODULES):
            return None
        wrapped = self.eval(func.args[0].value)
        return wrapped if isinstance(wrapped, FuncRef) else None

    def call_value(
        self,
        callee: Value,
        call: cst.Call,
        args: list[cst.Arg],
        kwargs: dict[str, cst.BaseExpression],
    ) -> Value:
        """Calling what ``call.func`` evaluated to; a callable chosen in a
        branch (``reduce = sum_of_token`` when a flag is set) is called on
        each alternative."""
        if isinstance(callee, Choice):
            return choice(
                [
                    (label, self.call_value(option, call, args, kwargs))
                    for label, option in callee.options
                ]
            )
        if isinstance(callee, FuncRef):
            return self.inline(callee, call)
        if isinstance(callee, ir.Atom) and callee.role is Role.REFERENCE_LOGP:
            # ``ref(input_ids=ids)``: a bare ``ref``, taken for the reference's
            # log-probs, is called: it is the reference model.
            return Unknown(code(call), (callee.name,), call=True, reference_model=True)
        if isinstance(callee, Instance):
            # ``self.kl_loss_fn(logp, ref, mask)``: an nn.Module's forward.
            for name in ("forward", "__call__"):
                method = self.context.project.method(callee.cls, callee.module, name)
                if method is not None:
                    return self.inline(replace(method, receiver=callee), call)
        # A class, by convention: no module parsed for a function. ``cls`` in
        # a classmethod is the class it was called on (``from_config``).
        called = call.func.value if isinstance(call.func, cst.Name) else ""
        builds_cls = called == "cls"
        class_called: str | None = None
        if isinstance(callee, Unknown):
            class_called = (
                called
                if called.lstrip("_")[:1].isupper()
                else callee.class_name
                if builds_cls
                else None
            )
            if (
                class_called is None
                and isinstance(call.func, cst.Subscript)
                and len(callee.names) == 1
                and callee.names[0][:1].isupper()
            ):
                # ``LOSS_CLASSES[config.loss_type](config)``: the class the
                # registry's entry for the setting names, an object to use.
                class_called = callee.names[0]
                builds_cls = True
        if class_called is not None:
            imported = self.module.imports.get(class_called)
            found = None
            if (
                imported is None
                or imported.name is None
                or not self.needs_no_parse(imported.module, imported.name, imported.level)
            ):
                found = self.context.project.class_named(class_called, self.module)
            if found is not None and (
                _callable_class(self.context.project, *found)
                or (
                    builds_cls
                    # ``return cls(batch["old_log_probs"], ...)`` of a dataclass:
                    # its fields, as a record built by name is.
                    and not (_record_class(found[0]) and "__init__" not in found[0].methods)
                )
            ):
                # An nn.Module (called later), or the object a classmethod
                # factory builds (``return cls(coef=...)``), whose methods run.
                return self.instantiate(found[0], found[1], call)
            if (
                found is not None
                and _record_class(found[0])
                and (_has_methods(found[0]) or not call.args)
            ):
                # ``kl: SequenceKL = SequenceKL()``, a dataclass built from its
                # defaults, or one with methods (``kl.estimate(...)`` matching
                # on ``self.kind``): an object whose fields hold their
                # defaults or what the call gives.
                return self.record_object(found[0], found[1], call)
            if found is not None and (call.args and _record_class(found[0])):
                # ``PolicyOutput(logprobs=..., values=...)`` of a dataclass or
                # ``NamedTuple``: ``out.logprobs`` is the log-prob computed,
                # with its role and gradient.
                fields = [f.name for f in found[0].fields if f.annotated]
                record = self.written_record(call, fields)
                if any(base.rpartition(".")[2] == "NamedTuple" for base in found[0].bases):
                    record.positional = tuple(fields)
                return record
            if (
                found is not None
                and found[1] is self.module
                and not _is_enum(found[0])
                and _has_methods(found[0])
                and roles.methods_that_may_compute_kl(found[1], found[0])
            ):
                # ``kl_penalty = KLPenalty(args.kl_loss_coef)``, then
                # ``kl_penalty.per_token_kl(logp, ref, mask)``: a helper object
                # of this file whose methods run where they are called. Only
                # one with a method that can compute a KL term (others change
                # no verdict), and not another module's (a trainer built in a
                # launch script would bring its whole training run along).
                return self.instantiate(found[0], found[1], call)
            if found is not None and len(args) == 1 and _is_enum(found[0]):
                # ``KLType(cfg.get("kl_type", "k3"))``: the member of that
                # value, which stands for its value as ``KLType.K3`` does.
                member = self.eval(args[0].value)
                if isinstance(member, ir.Const):  # ``KLType(1)`` of an ``IntEnum``
                    number = member.value
                    return Py(int(number) if float(number).is_integer() else number)
                if isinstance(member, (Py, Choice)):
                    return member
        if isinstance(callee, Unknown):
            if callee.module is not None:
                level = len(callee.module) - len(callee.module.lstrip("."))
                module, _, name = callee.module.lstrip(".").rpartition(".")
                module = "." * level + module
                return self.call_module_function(module, name, call, args, kwargs)
            return self.call_builtin(callee, call, args, kwargs)
        if isinstance(callee, ir.Atom) and isinstance(call.func, cst.Name):
            # ``policy_logp_fn(batch)``: a parameter named like log-probs is
            # called, so it is the function that computes them.
            name = call.func.value
            return self.call_builtin(Unknown(name, (name,)), call, args, kwargs)
        assumed = self.assumed_reduction(call)
        if assumed is not None:
            return assumed
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
            number = self.eval(args[0].value)
            if isinstance(number, Unknown) and number.call:
                # ``int(seq_idx.max()) + 1``: a count read off a tensor, a
                # Python number without a graph.
                return replace(number, detached=True)
            return number
        if name == "dict" and not args and call.args:
            # ``dict(advantages=advantages, ...)``: the dict written out.
            return self.written_record(call, ())
        if name == "dict" and len(args) == 1 and kwargs and _names_a_value(args[0].value):
            # ``dict(data, kl=torch.cat(kl_chunks))``: a copy of a batch with
            # entries added, read back as ``mb["kl"]``; as ``{**data, "kl": ...}``.
            copied = self.entries_of(self.eval(args[0].value))
            return DictVal({**copied, **self.written_record(call, ()).items})
        held = self.mapping_built(name, args)
        if held is not None:
            return held
        if name == "sum" and args:
            # ``sum(losses.values())`` over a dict of loss terms; a list of
            # penalties appended one by one. ``sum(loss for mb in
            # micro_batches)``: one row stands for every row (a sum over the
            # batch keeps each token's gradient).
            terms = self.eval(args[0].value)
            if isinstance(terms, Seq) and terms.items:
                total = terms.items[0]
                for item in terms.items[1:]:
                    total = self.binary("add", total, item, call)
                return total
        if name == "getattr" and len(args) >= 2:
            attr = self.eval(args[1].value)
            if isinstance(attr, Py) and isinstance(attr.value, str):
                owner = self.eval(args[0].value)
                loaded = self.module_member(owner, attr.value)
                if loaded is not None:
                    return loaded
                value = self.attribute(owner, attr.value, call)
                if len(args) >= 3 and isinstance(value, Unknown):
                    # ``getattr(self.args, "kl_estimator", "k1")``: a setting the
                    # package gives no default takes the fallback written here,
                    # as ``cfg.get("kl_type", "k3")`` does.
                    fallback = self.eval(args[2].value)
                    if isinstance(fallback, Py) and isinstance(fallback.value, str):
                        return fallback
                return value
        if name == "str" and len(args) == 1 and not kwargs:
            text = self.eval(args[0].value)
            if isinstance(text, Py) and isinstance(text.value, str):
                return text  # ``str(value).strip().lower()`` in a validator
        if name == "len" and args:
            return ir.Atom(Role.COEFFICIENT, code(call))
        if name in ("min", "max") and len(args) >= 2 and not kwargs:
            # ``min(1.0, (step + 1) / cfg.kl_warmup_steps)``: a schedule of
            # numbers is a coefficient (Python's ``min`` of tensors compares
            # them whole, so it is never a per-token clip).
            if all(_a_number(self.eval(arg.value)) for arg in args):
                return ir.Atom(Role.COEFFICIENT, code(call))
        if name in ("list", "tuple") and len(args) == 1 and not kwargs and _lists(args[0].value):
            # ``list(map(sequence_k2, logps, ref_logps))``: the same items.
            items = self.eval(args[0].value)
            if isinstance(items, Seq):
                return items
        if name == "reversed" and len(args) == 1 and not kwargs and _lists(args[0].value):
            # ``torch.stack(list(reversed(advantages_reversed)), dim=1)``: the
            # steps of a backward loop put back in order.
            items = self.eval(args[0].value)
            if isinstance(items, Seq):
                return replace(items, items=list(reversed(items.items)))
        if name in ("list", "tuple") and len(args) == 1 and split_tensor(args[0].value):
            # ``list(torch.split(per_token_loss, seq_lens))``: the pieces,
            # each what the tensor is.
            return self.eval(args[0].value)
        if name in ("map", "zip") and args and not kwargs:
            mapped = self.map_rows(name, call, args)
            if mapped is not None:
                return mapped
        if name == "zip" and len(call.args) == 1 and call.args[0].star == "*":
            # ``pg_terms, kl_terms = zip(*[terms(mb) for mb in micro_batches])``:
            # the tuples each step returned, transposed.
            rows = self.eval(call.args[0].value)
            tuples = (
                [row for row in rows.items if isinstance(row, Seq)] if isinstance(rows, Seq) else []
            )
            if tuples and len(tuples) == len(rows.items) and all(row.items for row in tuples):  # type: ignore[union-attr]
                width = min(len(row.items) for row in tuples)
                return Seq(
                    [
                        Seq([row.items[i] for row in tuples], appended=rows.appended)  # type: ignore[union-attr]
                        for i in range(width)
                    ]
                )
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
            description = sinks.backward_description(full_code(call), method)
            if selectors.maximises(self.module, self.cls):
                # ``torch.optim.AdamW(..., maximize=True)``: the optimizer climbs
                # what is backpropagated, as if it minimised its negation.
                value = self.lift1(value, ir.neg)
                description += ", maximised (the optimizer has maximize=True)"
            self.add_sink(value, description, True, call, backward=True)
            return Py(None)
        if method in sinks.STEP_METHODS:
            # Whichever argument is a differentiable tensor is the loss.
            for arg in args:
                value = self.eval(arg.value)
                if isinstance(value, (ir.Node, Choice)):
                    description = sinks.backward_description(full_code(call), method)
                    self.add_sink(value, description, True, call, backward=True)
            return Py(None)
        if method == "remote":
            remote = self.ray_remote_call(func.value, call)
            if remote is not None:
                return remote
        if _calls_super(func.value) and self.cls is not None and method != "__init__":
            # ``pg_loss, metrics = super().compute_loss(logprobs, data)`` in an
            # override: the base class's method, on the same object.
            parent = self.context.project.parent_method(self.cls, self.module, method)
            passed = [self.eval(a.value) for a in call.args] if parent is not None else []
            if parent is not None and (
                # The object itself always holds something: followed only when
                # given log-probs, or when the base's method can compute a KL
                # itself. (A base's ``__init__`` builds the object; a model's
                # ``super().__init__(config)`` is most of them.)
                any(map(roles.may_carry_kl, passed))
                or roles.may_compute_kl(
                    parent.module, parent.name, parent.cls, self.context.role_patterns
                )
            ):
                this = self.env.get("self")
                return self.inline(
                    replace(parent, receiver=this) if isinstance(this, Instance) else parent,
                    call,
                    evaluated=passed,
                )
        if method == "sub" and isinstance(func.value, cst.Name) and func.value.value == "re":
            slug = self.regex_substitution(args)
            if slug is not None:
                return slug
        if method == "select" and code(func.value).rpartition(".")[2] == "OmegaConf":
            selected = self.omegaconf_select(call, args)
            if selected is not None:
                return selected
        receiver = self.eval(func.value)
        if isinstance(receiver, Instance) or (
            isinstance(receiver, Unknown) and receiver.names == ("self",) and self.cls is not None
        ):
            attribute = self.attribute(receiver, method, func)
            if isinstance(attribute, (FuncRef, Instance)):
                return self.call_value(attribute, call, args, kwargs)
        if isinstance(receiver, (Py, Choice)) and method in STRING_METHODS:
            result = self.string_method(receiver, method, args)
            if result is not None:
                return result
        if isinstance(receiver, DictVal) and method == "get" and 1 <= len(args) <= 2:
            # ``KL_ALIASES.get(name, name)`` of a selector: the entry, else the fallback.
            looked_up = self.eval(args[0].value)
            if isinstance(looked_up, Py) and isinstance(looked_up.value, str):
                if looked_up.value in receiver.items:
                    return receiver.items[looked_up.value]
                return self.eval(args[1].value) if len(args) == 2 else Py(None)
        if isinstance(receiver, DictVal) and method == "_replace" and kwargs and not args:
            # ``out._replace(kl=...)`` of a ``NamedTuple``: a copy, those fields new.
            return self.replaced(receiver, kwargs)
        if isinstance(receiver, DictVal) and method == "values" and not args:
            return Seq(list(receiver.items.values()))
        if isinstance(receiver, DictVal) and method == "update":
            # ``metrics.update(apply_kl_penalty(batch, ...))``: the helper runs
            # (and writes into ``batch``); its entries join the dict.
            for arg in args:
                entries = self.eval(arg.value)
                if isinstance(entries, DictVal):
                    receiver.items.update(entries.items)
            for entry_name, expr in kwargs.items():
                receiver.items[entry_name] = self.eval(expr)
            return Py(None)
        if isinstance(receiver, Unknown) and method == "update" and kwargs and not args:
            # ``batch.update(advantages=advantages, returns=returns)``: each
            # entry written by key, as ``batch["advantages"] = advantages``.
            for entry_name, expr in kwargs.items():
                entry = cst.SubscriptElement(cst.Index(cst.SimpleString(repr(entry_name))))
                self.assign(cst.Subscript(value=func.value, slice=[entry]), self.eval(expr), call)
            return Py(None)
        if (
            (method in IN_PLACE or method == "copy_")
            and isinstance(func.value, cst.Subscript)
            and args
        ):
            # ``kl[:, start:end].copy_(x)``, ``kl[:, s:e].mul_(m)``: a write into
            # the rows the subscript names, as ``kl[:, start:end] = x`` is.
            written = (
                self.eval(args[0].value)
                if method == "copy_"
                else self.method_op(IN_PLACE[method], receiver, args, kwargs, call)
            )
            self.assign(func.value, written, call)
            return written
        if isinstance(func.value, cst.Name) and self.mutate(
            func.value.value, method, args, kwargs, call
        ):
            # A tensor's in-place method returns the tensor
            # (``return out.index_add_(0, sample_idx, values)``).
            return self.env[func.value.value] if method in IN_PLACE else Py(None)
        if method == "set" and isinstance(receiver, Unknown) and len(args) == 2:
            # ``data.set("kl", kl)`` (a TensorDict): ``data["kl"] = kl``.
            key = _string_key(args[:1])
            if key is not None:
                stored = self.eval(args[1].value)
                if sinks.may_hold_kl(stored) or sinks.carries_the_policys_gradient(stored):
                    self.context.write(receiver, key, stored)
                    return receiver
        if isinstance(receiver, Instance) and method == lowering.SAVE_FOR_BACKWARD:
            # ``ctx.save_for_backward(ratio)`` in a custom Function's forward.
            receiver.attrs[lowering.SAVED_TENSORS[0]] = Seq([self.eval(a.value) for a in args])
            return Py(None)
        if isinstance(receiver, Unknown) and (receiver.class_name or receiver.module):
            if method == lowering.AUTOGRAD_FUNCTION_CALL:
                custom = self.autograd_function(func.value, call)
                if custom is not None:
                    return custom
            static = self.class_method(func.value, method)
            if static is not None:
                return self.inline(static, call)
        if (
            method in lowering.LOSS_SCALING
            and isinstance(receiver, (Unknown, ir.Opaque))
            and len(args) == 1
        ):
            # ``scaler.scale(loss).backward()`` (AMP), the scaler built by
            # ``torch.amp.GradScaler(...)`` or not: the scaled loss is the loss.
            scaled = self.eval(args[0].value)
            if isinstance(scaled, (ir.Node, Choice)):
                return scaled
        if isinstance(receiver, Unknown) and receiver.module is not None:
            return self.call_module_function(receiver.module, method, call, args, kwargs)
        if lowering.is_marker(receiver) and method in TENSOR_IDENTITY:
            return receiver  # ``weights.to(log_ratio.dtype)``: the same matrix
        if isinstance(receiver, (ir.Node, Choice, Flipped, Grouped)) and not isinstance(
            receiver, ir.Opaque
        ):
            # ``(exp(x) - x).sub_(1.0)``: an in-place method on a temporary is
            # its operation; nothing else holds the tensor it changes.
            return self.method_op(IN_PLACE.get(method, method), receiver, args, kwargs, call)
        if (
            isinstance(receiver, Seq)
            and not receiver.appended
            and receiver.items
            and all(isinstance(i, (ir.Node, Choice)) for i in receiver.items)
            and (method in DETACHING or method in TENSOR_IDENTITY)
        ):
            # ``torch.stack([kl_sum, token_count]).detach()``: each row's value
            # (``stats[0]`` reads it back), without its graph.
            return Seq(
                [self.method_op(method, item, args, kwargs, call) for item in receiver.items]
            )
        if (
            isinstance(receiver, ir.Opaque)
            and ir.is_new_constant_tensor(receiver)
            and method in lowering.SEGMENT_SUMS | lowering.PUTS | lowering.TRIANGLES
        ):
            # ``torch.zeros(n).index_add_(0, seg_ids, x)``: per-slot sums of ``x``;
            # ``torch.zeros(n).index_put_((idx,), x)``: ``x`` in its slots;
            # ``torch.ones(T, T).tril()``: the matrix of a reward-to-go.
            return self.method_op(method, receiver, args, kwargs, call)
        if isinstance(receiver, Unknown):
            if receiver.names == ("self",) and self.self_class is not None:
                found = self.context.project.method(*self.self_class, method)
                if found is not None and found.is_property:
                    # ``self.kl_fn(logp, ref)`` with ``@property def kl_fn``:
                    # the property gives the function that is called.
                    given = self.inline(found, cst.Call(func=call.func))
                    if isinstance(given, (FuncRef, Instance)):
                        return self.call_value(given, call, args, kwargs)
                    return Unknown(code(call), (method,), call=True)
                if found is not None:
                    return self.inline(found, call)
            owned = self.method_of_a_local(func.value, receiver, method)
            if owned is not None:
                return self.inline(owned, call)
            return self.unknown_method(call, method, receiver, args, kwargs)
        return Unknown(code(call), (method,), call=True)

    def annotated_class(
        self, name: str, fn: cst.FunctionDef
    ) -> tuple[ClassInfo, ModuleInfo] | None:
        """The class of the project a parameter's annotation names
        (``maker: ExperienceMaker``)."""
        annotation = selectors.annotation_of(fn, name)
        if not (isinstance(annotation, cst.Name) and annotation.value[:1].isupper()):
            return None
        return self.context.project.class_named(annotation.value, self.module)

    def map_rows(self, name: str, call: cst.Call, args: list[cst.Arg]) -> Value | None:
        """``zip(logps, ref_logps)`` of tensors: one row of each, standing for
        every row, as a loop over them binds it. ``map(sequence_k2, logps,
        ref_logps)``: the function applied to those rows."""
        given = args[1:] if name == "map" else args
        if not given or any(a.star for a in given):
            return None
        iterated = [self.eval(a.value) for a in given]
        tuples = _written_tuples(iterated)
        if tuples is not None:
            # ``zip(self.weights, (pg_loss, kl_loss))`` of tuples written out:
            # item by item, each pair its own.
            if name == "zip":
                return Seq([Seq(list(items)) for items in tuples])
            each = [self.apply_to_rows(args[0].value, call, list(items)) for items in tuples]
            return Seq(each) if all(v is not None for v in each) else None  # type: ignore[arg-type]
        if (
            name == "map"
            and len(iterated) == 1
            and isinstance(iterated[0], Seq)
            and not iterated[0].appended
            and iterated[0].items
        ):
            # ``map(lambda t: t.detach().float(), (logp, old, ref))``: each item.
            each = [self.apply_to_rows(args[0].value, call, [item]) for item in iterated[0].items]
            return Seq(each) if all(v is not None for v in each) else None  # type: ignore[arg-type]
        rows = [_row(value) for value in iterated]
        tensors = (ir.Node, Choice) if name == "zip" else (ir.Node, Choice, Unknown)
        if not all(isinstance(r, tensors) for r in rows):
            return None
        if name == "zip":
            return Seq([Seq(rows)], appended=True)
        applied = self.apply_to_rows(args[0].value, call, rows)
        return Seq([applied], appended=True) if applied is not None else None

    def apply_to_rows(
        self, function: cst.BaseExpression, call: cst.Call, rows: list[Value]
    ) -> Value | None:
        """A function of the project (a lambda, a ``partial``) or of the
        ``operator`` module called on values already evaluated."""
        if (
            isinstance(function, cst.Attribute)
            and isinstance(function.value, cst.Name)
            and function.value.value == "operator"
            and function.attr.value in _OPERATORS
            and len(rows) == 2
        ):
            return self.binary(_OPERATORS[function.attr.value], rows[0], rows[1], call)
        callee = self.function_given(function)
        if not isinstance(callee, FuncRef):
            return None
        placeholders = [cst.Arg(value=cst.Name("_row")) for _ in rows]
        return self.inline(callee, call, evaluated=rows, arguments=placeholders)

    def reduce_with_an_operator(self, call: cst.Call, args: list[cst.Arg]) -> Value | None:
        """``functools.reduce(operator.add, terms)``: the terms added up."""
        op = args[0].value
        if not (
            isinstance(op, cst.Attribute)
            and isinstance(op.value, cst.Name)
            and op.value.value == "operator"
            and op.attr.value in ("add", "mul", "iadd", "imul")
        ):
            return None
        kind = _OPERATORS[op.attr.value]
        start = self.eval(args[2].value) if len(args) == 3 else None

        def fold(terms: Value) -> Value | None:
            if isinstance(terms, Choice):
                # ``terms.append(kl_term)`` under a flag: each list it may be.
                folded = [(label, fold(option)) for label, option in terms.options]
                if any(f is None for _, f in folded):
                    return None
                return choice([(label, f) for label, f in folded if f is not None])
            if not isinstance(terms, Seq) or not terms.items:
                return None
            items = [start, *terms.items] if start is not None else list(terms.items)
            total = items[0]
            for item in items[1:]:
                total = self.binary(kind, total, item, call)
            return total

        return fold(self.eval(args[1].value))

    def ray_remote_call(self, target: cst.BaseExpression, call: cst.Call) -> Value | None:
        """``self.ref_actor.kl_to_reference.remote(...)``: the method of the one
        Ray actor class of this file that defines it (``shape.remote(...)``
        of a ``@ray.remote`` function likewise), run in another process. What
        it returns arrives there without a graph: detached."""
        ref: FuncRef | None = None
        if isinstance(target, cst.Attribute):
            name = target.attr.value
            # A file without ``remote`` decorators has no actor class: its
            # classes are not parsed to look.
            actors = _REMOTE_DECORATOR.search(self.module.source) is not None
            owners = [
                c
                for c in self.module.classes.values()
                if actors and name in c.methods and _ray_remote(c.node.decorators)
            ]
            if len(owners) == 1:
                ref = self.context.project.method(owners[0], self.module, name)
                if ref is not None:
                    # The actor's own methods are what ``self`` reaches there.
                    ref = replace(ref, receiver=Instance(owners[0], self.module, unbuilt=True))
        elif isinstance(target, cst.Name):
            fn = self.module.functions.get(target.value)
            if fn is not None and _ray_remote(fn.decorators):
                ref = FuncRef(fn, self.module)
        if ref is None:
            return None
        result = self.inline(ref, call)
        return self.lift1(result, ir.detach) if isinstance(result, (ir.Node, Choice)) else result

    def method_of_a_local(
        self, expr: cst.BaseExpression, receiver: Unknown, method: str
    ) -> FuncRef | None:
        """``maker.advantages_from(...)`` on a parameter kllint was not given:
        the method of the class its annotation names (``maker: ExperienceMaker``),
        else of the one class of this file that defines a method so named.
        Not a tensor's method (``x.mean()``), whatever the file defines, nor
        a loss."""
        if (
            not isinstance(expr, cst.Name)
            or expr.value == "self"
            or receiver.names != (expr.value,)
            or method in lowering.TENSOR_METHODS
            or method.startswith("__")
        ):
            return None
        project = self.context.project
        annotated = (
            self.annotated_class(expr.value, self.function_node)
            if isinstance(self.function_node, cst.FunctionDef)
            else None
        )
        if annotated is not None:
            ref = project.method(*annotated, method)
        else:
            owners = [c for c in self.module.classes.values() if method in c.methods]
            ref = project.method(owners[0], self.module, method) if len(owners) == 1 else None
        if ref is not None and sinks.is_loss_function(
            method,
            ref.cls.name if ref.cls else None,
            self.context.calls,
            selects=False,
            registered=self.context.registered,
        ):
            # ``trainer.actor_loss(...)``: a loss is judged where it is
            # defined, as an entry; followed here it would be reported twice.
            return None
        return ref

    def autograd_function(self, receiver: cst.BaseExpression, call: cst.Call) -> Value | None:
        """``FusedKL.apply(logp, ref)``, a ``torch.autograd.Function`` of the
        project: the value ``forward`` returns with the gradient ``backward``
        gives each input. A backward that returns ``grad_output`` times a
        factor (a fused derivative, a score function's weight) is read as
        that factor, the vector-Jacobian product of an elementwise map:
        the term is ``sg(value) + sum_i sg(factor_i) * (x_i - sg(x_i))``, which
        has both. Any other backward leaves the call unknown."""
        if not isinstance(receiver, cst.Name) or any(a.keyword or a.star for a in call.args):
            return None
        found = self.context.project.class_named(receiver.value, self.module)
        if found is None or not lowering.is_autograd_function(found[0].bases):
            return None
        cls, module = found
        forward = self.context.project.method(cls, module, "forward")
        backward = self.context.project.method(cls, module, "backward")
        if forward is None or backward is None:
            return None
        inputs = [self.eval(a.value) for a in call.args]
        ctx = Instance(cls, module)
        value = self.inline(replace(forward, bound=False, preset_args=(ctx,)), call, inputs)
        if not isinstance(value, ir.Node) or isinstance(value, ir.Opaque):
            return None
        params = [*backward.node.params.posonly_params, *backward.node.params.params]
        if len(params) != 2:
            return None
        grad_output = ir.Atom(Role.COEFFICIENT, params[1].name.value)
        given = self.inline(
            replace(backward, bound=False, preset_args=(ctx, grad_output)), call, [], []
        )
        grads = given.items if isinstance(given, Seq) else [given]
        origin = self.origin(call)
        if self.call_site is None:
            origin.notes.append(f"gradient read from the hand-written `{cls.name}.backward`")
        term = ir.detach(value, origin)
        for position, x in enumerate(inputs):
            if not isinstance(x, ir.Node) or not ir.depends_on_policy(x):
                continue
            grad = grads[position] if position < len(grads) else Py(None)
            if isinstance(grad, Py) and grad.value is None:
                continue  # ``return None``: no gradient for this input
            if not isinstance(grad, ir.Node):
                return None
            factor = _factor_of(grad, grad_output)
            if factor is None:
                return None
            score = ir.binary("sub", x, ir.detach(x, origin), origin)
            term = ir.binary(
                "add", term, ir.binary("mul", ir.detach(factor, origin), score, origin), origin
            )
        return term

    def instantiate(
        self,
        cls: ClassInfo,
        module: ModuleInfo,
        call: cst.Call,
        evaluated: Sequence[Value] | None = None,
    ) -> Instance:
        """``KLLoss(kind="low_var_kl")``: an object whose ``__init__`` ran
        with the constructor's arguments, so its attributes are known."""
        instance = Instance(cls, module)
        init = self.context.project.method(cls, module, "__init__")
        if init is not None:
            # The arguments as they are here; ``__init__`` runs when the
            # object is first read, in the place and mode it was built in.
            arguments = (
                list(evaluated)
                if evaluated is not None
                else [self.eval(a.value) for a in call.args]
            )
            statement, no_grad = self.statement, self.no_grad

            def build() -> None:
                saved = self.statement, self.no_grad
                self.statement, self.no_grad = statement, no_grad
                try:
                    self.inline(replace(init, receiver=instance), call, arguments)
                finally:
                    self.statement, self.no_grad = saved

            instance.pending = build
        return instance

    def record_object(self, cls: ClassInfo, module: ModuleInfo, call: cst.Call) -> Instance:
        """A dataclass object: its fields' defaults, then what the call gives."""
        instance = Instance(cls, module)
        for field in cls.fields:
            if not field.annotated:
                continue
            default = field.literal if field.literal is not None else field.field_default
            if default is None and field.names_its_module:
                default = dotted_module_name(module.path)
            if default is not None:
                instance.attrs[field.name] = Py(default)
            elif field.member is not None:
                # ``kl_mode: KLMode = KLMode.FULL_VOCAB``: the member's value.
                member = selectors.class_constant(module, *field.member)
                if member is not None:
                    instance.attrs[field.name] = member
        given = self.written_record(call, [f.name for f in cls.fields if f.annotated])
        instance.attrs.update(given.items)
        return instance

    def written_record(self, call: cst.Call, fields: Sequence[str]) -> DictVal:
        """The entries a call builds: its keywords, its positional arguments
        under ``fields`` in order, and a ``**`` dict kllint holds."""
        items: dict[str, Value] = {}
        for position, arg in enumerate(call.args):
            if arg.star == "**":
                given = self.eval(arg.value)
                if isinstance(given, DictVal):
                    items.update(given.items)
            elif arg.keyword is not None:
                items[arg.keyword.value] = self.eval(arg.value)
            elif not arg.star and position < len(fields):
                items[fields[position]] = self.eval(arg.value)
        for key, value in items.items():
            if sinks.may_hold_kl(value):
                # ``Experience(..., kl, ...)``: read back as ``experience.kl``
                # by another function of the file (an actor's loss).
                self.context.keep_kl_entry(key, value)
        return DictVal(items)

    def class_method(self, receiver: cst.BaseExpression, method: str) -> FuncRef | None:
        """``KLUtils.compute_kl(...)``: a static or class method of a class of
        the project, called on the class."""
        if not isinstance(receiver, cst.Name) or not receiver.value[:1].isupper():
            return None
        found = self.context.project.class_named(receiver.value, self.module)
        if found is None:
            return None
        ref = self.context.project.method(found[0], found[1], method)
        if ref is None:
            return None
        params = ref.node.params.params
        if params and params[0].name.value == "cls":
            # ``LowVarianceKLShaper.from_config(config)``: ``cls`` is the class
            # it is called on, a subclass of the one that defines it.
            named = Unknown(receiver.value, (receiver.value,), class_name=receiver.value)
            return replace(ref, bound=False, preset_kwargs={**ref.preset_kwargs, "cls": named})
        return replace(ref, bound=False)

    def string_method(
        self, receiver: Py | Choice, method: str, args: list[cst.Arg]
    ) -> Value | None:
        """``kl_penalty.rstrip("+")``, ``name.endswith("+")``, ``mode.lower()``
        on a selector: computed, so that the branch it feeds is decided."""
        arguments = [self.eval(a.value) for a in args]
        if not all(isinstance(a, Py) for a in arguments):
            return None
        if isinstance(receiver, Choice):
            options = [
                (
                    label,
                    self.string_method(v, method, args) if isinstance(v, (Py, Choice)) else None,
                )
                for label, v in receiver.options
            ]
            if any(v is None for _, v in options):
                return None
            return Choice([(label, v) for label, v in options if v is not None])
        if not isinstance(receiver.value, str):
            return None
        try:
            result = getattr(receiver.value, method)(*(a.value for a in arguments))  # type: ignore[union-attr]
        except (TypeError, ValueError):
            return None
        if isinstance(result, (str, bool, int)):
            return Py(result, receiver.source)
        if isinstance(result, (list, tuple)):
            # ``spec.partition("@")``, ``name.split(":")``: the pieces, each a selector.
            return Seq([Py(piece, receiver.source) for piece in result])
        return None

    def module_member(self, owner: Value, name: str) -> Value | None:
        """``getattr(importlib.import_module("pkg.kl"), "approx_kl_k1")``: the
        function or class of a module of the project (this one's own names
        when it loads itself through ``__name__``)."""
        if not (
            isinstance(owner, Unknown) and owner.module is not None and owner.text == owner.module
        ):
            return None
        target = self.context.project.resolve_module(owner.module, self.module.path)
        if target is None:
            return None
        if target is self.module or target.path == self.module.path:
            if name in self.module.functions or name in self.module.classes:
                return self.lookup(name)
            return None
        if name in target.functions:
            return self.context.project.function_at(f"{owner.module}.{name}", self.module.path)
        return None

    def regex_substitution(self, args: list[cst.Arg]) -> Py | None:
        """``re.sub(r"[^0-9a-z_]+", "_", name.lower())`` of a selector: the
        slug it becomes, so that the lookup after it is decided."""
        if len(args) != 3:
            return None
        pattern, replacement, string = (self.eval(a.value) for a in args)
        if not all(
            isinstance(v, Py) and isinstance(v.value, str) for v in (pattern, replacement, string)
        ):
            return None
        try:
            slug = re.sub(pattern.value, replacement.value, string.value)  # type: ignore[union-attr, arg-type]
        except (re.error, IndexError):
            return None
        return Py(slug, string.source)  # type: ignore[union-attr]

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
        if (
            method == "append"
            and isinstance(current, Choice)
            and args
            and all(isinstance(option, Seq) for _, option in current.options)
        ):
            # ``kl_terms.append(...)`` in a loop after a flag chose, on an earlier
            # step, whether to append: each path's list grows.
            item = self.eval(args[0].value)
            self.env[name] = Choice(
                [
                    (label, Seq([*option.items, item], appended=True))  # type: ignore[union-attr]
                    for label, option in current.options
                ]
            )
            return True
        if method in IN_PLACE and isinstance(current, (ir.Node, Choice)):
            # ``kl.mul_(mask)``: the tensor becomes what the operation gives.
            self.env[name] = self.method_op(IN_PLACE[method], current, args, kwargs, call)
            return True
        if method == "copy_" and args and isinstance(current, (ir.Node, Choice)):
            # ``buffer.copy_(x)``: the buffer holds ``x`` (autograd records the copy).
            self.env[name] = self.eval(args[0].value)
            return True
        if method in MUTATING and name in self.env:
            self.env[name] = Unknown(name, (name,))
            return True
        return False

    def omegaconf_select(self, call: cst.Call, args: list[cst.Arg]) -> Py | ir.Atom | None:
        """``OmegaConf.select(cfg, "actor.kl_loss_type", default="low_var_kl")``:
        ``cfg.get`` of a dotted key: the package's default for the setting,
        else the fallback given (a selector's literal)."""
        if len(args) < 2:
            return None
        config, path = self.eval(args[0].value), _string_key(args[1:2])
        if not isinstance(config, Unknown) or path is None:
            return None
        *sections, key = path.split(".")
        setting = self.setting_default(replace(config, names=(*config.names, *sections)), key)
        if setting is not None:
            return setting
        fallback = next(
            (a.value for a in args[2:] if a.keyword is not None and a.keyword.value == "default"),
            None,
        )
        given = self.eval(fallback) if fallback is not None else None
        if isinstance(given, Py) and isinstance(given.value, str):
            return Py(given.value, source=f"`{path}` unset in the config")
        if isinstance(given, (Py, ir.Const)) and not isinstance(given.value, (bool, str)):
            # ``default=0.0`` for ``actor.kl_loss_coef``: a coefficient of the
            # run, of any value (a fallback of 0 must not switch the term off).
            return ir.Atom(Role.COEFFICIENT, code(call))
        return None

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
        by_hand = lowering.normaliser_by_hand(method, receiver, call)
        if by_hand is not None:
            return by_hand
        if (
            method in TENSOR_IDENTITY
            or method in UNARY
            or method in DETACHING
            or method in lowering.ON_RESOLVED
            or method in SPLITS
        ):
            node = self.resolve(receiver)
            if isinstance(node, ir.Node) and not isinstance(node, ir.Opaque):
                return self.method_op(method, node, args, kwargs, call)
            if method in DETACHING:
                return replace(receiver, text=code(call), detached=True)
            if method in ("gather", "take_along_dim"):
                index = (
                    (args[1].value if len(args) > 1 else kwargs.get("index"))
                    if method == "gather"
                    else (args[0].value if args else kwargs.get("indices"))
                )
                if index is not None and lowering.top_k_support(self.eval(index)):
                    return receiver
                return replace(receiver, distribution=False)
            if method == "squeeze" and _squeezes_the_batch(receiver, args):
                # ``model(ids).logits.squeeze(0)``: one packed sequence, [T, V];
                # its first axis is time.
                return replace(receiver, text=code(call), per_token=True)
            if method in TENSOR_IDENTITY:
                return receiver
        return self.unknown_call(call, method, receiver, args)

    def replaced(self, record: DictVal, fields: dict[str, cst.BaseExpression]) -> DictVal:
        changed = {name: self.eval(expr) for name, expr in fields.items()}
        return DictVal({**record.items, **changed}, positional=record.positional)

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
        if module == "operator" and name in _OPERATORS and args and not kwargs:
            # ``operator.sub(log_prob, ref_log_prob)``: the operation written out.
            operands = [self.eval(a.value) for a in args]
            if len(operands) == 1 and name == "neg":
                return self.lift1(operands[0], lambda n: ir.neg(n, self.origin(call)))
            if len(operands) == 2 and name != "neg":
                return self.binary(_OPERATORS[name], operands[0], operands[1], call)
        if module == "functools" and name == "reduce" and len(args) in (2, 3):
            folded = self.reduce_with_an_operator(call, args)
            if folded is not None:
                return folded
        if module == "dataclasses" and name == "replace" and len(args) == 1 and kwargs:
            # ``dataclasses.replace(out, loss=out.loss + beta * kl)``: a copy of
            # the record, those fields new.
            record = self.eval(args[0].value)
            if isinstance(record, DictVal):
                return self.replaced(record, kwargs)
        if module == "itertools" and name == "chain" and args and not kwargs:
            # ``chain(self._pg_losses(batch), self._kl_losses(batch))``: the
            # items of each in turn, a loop over them runs for each.
            streams = [self.eval(a.value) for a in args]
            lists = [s for s in streams if isinstance(s, Seq)]
            if len(lists) == len(streams):
                return Seq([item for s in lists for item in s.items], generated=True)
        if module == "itertools" and name == "starmap" and len(args) == 2:
            rows = self.eval(args[1].value)
            pairs = [r for r in rows.items if isinstance(r, Seq)] if isinstance(rows, Seq) else []
            if (
                isinstance(rows, Seq)
                and not rows.appended
                and pairs
                and len(pairs) == len(rows.items)
                and not any(p.appended for p in pairs)
            ):
                # Over pairs written out (``zip(weights, terms)``): each its own.
                each = [self.apply_to_rows(args[0].value, call, list(p.items)) for p in pairs]
                if all(v is not None for v in each):
                    return Seq(each)  # type: ignore[arg-type]
            row = rows.items[0] if isinstance(rows, Seq) and rows.items else None
            if isinstance(row, Seq) and row.items:
                applied = self.apply_to_rows(args[0].value, call, list(row.items))
                if applied is not None:
                    return Seq([applied], appended=True)
        if module == "importlib" and name == "import_module" and args:
            # ``importlib.import_module(cfg.kl_module)`` of a module the settings
            # name: that module, as ``import`` would give it.
            dotted = self.eval(args[0].value)
            if isinstance(dotted, Py) and isinstance(dotted.value, str) and dotted.value:
                return Unknown(
                    dotted.value, (dotted.value.rpartition(".")[2],), module=dotted.value
                )
        if module == "ray" and name == "get" and len(args) == 1:
            # ``ray.get(ref)``: what the remote call gave (see ``ray_remote_call``).
            return self.eval(args[0].value)
        if module == "functools" and name == "partial" and args:
            partial = self.partial(args, kwargs)
            if partial is not None:
                return partial
        if (
            module.split(".")[0] == "einops"
            and name == "einsum"
            and len(args) >= 2
            and isinstance(args[-1].value, cst.SimpleString)
        ):
            summed = lowering.einops_einsum(
                self.torch_call(call),
                str(args[-1].value.evaluated_value),
                [self.eval(a.value) for a in args[:-1]],
            )
            if summed is not None:
                return summed
        if len(args) >= 2 and isinstance(args[1].value, cst.SimpleString):
            pattern = args[1].value.evaluated_value
            if lowering.is_einops_view(module, name, pattern):
                return lowering.einops_rearranged(str(pattern), self.eval(args[0].value))
            how = kwargs.get("reduction", args[2].value if len(args) > 2 else None)
            if module.split(".")[0] == "einops" and name == "reduce" and how is not None:
                reduction = self.eval(how)
                reduced = lowering.einops_reduced(
                    self.torch_call(call),
                    str(pattern),
                    reduction.value if isinstance(reduction, Py) else None,
                    self.eval(args[0].value),
                )
                if reduced is not None:
                    return reduced
        namespace = lowering.namespace(module, level)
        if namespace == "no-autograd":
            given = [self.eval(a.value) for a in call.args if not a.star]
            if module.split(".")[0] in ("np", "numpy") and any(map(_copied_out, given)):
                # ``np.exp(neg_log_ratio)`` of an array copied out of a tensor
                # (``lp.detach().cpu().numpy()``): the same arithmetic as
                # torch's, on values without a graph.
                return self.lift1(self.call_torch(name, call, args, kwargs), ir.detach)
            return Unknown(code(call), (name,), call=True, numpy=True)
        if namespace == "torch":
            return self.call_torch(name, call, args, kwargs)
        evaluated = None
        if self.needs_no_parse(module, name, level):
            # A function that can compute no KL term, in a file not parsed yet:
            # given no log-prob, following it would only cost a parse.
            evaluated = [self.eval(a.value) for a in call.args]
            if not any(roles.may_carry_kl(v) for v in evaluated):
                return Unknown(code(call), (name,), call=True)
        ref = self.context.project.function(module, name, self.module.path, level)
        if ref is not None:
            return self.inline(ref, call, evaluated)
        # ``from pkg.mod import fn`` where fn is a submodule attribute or unresolved
        return self.named_call(name, call, args, kwargs, None)

    def needs_no_parse(self, module: str, name: str, level: int) -> bool:
        """``name`` of ``module`` (no leading dots) is, by its file's sketch, a
        function that cannot compute a KL term or a class whose objects are
        never called, and LibCST has not parsed that file yet."""
        project, patterns = self.context.project, self.context.role_patterns
        if patterns.policy or patterns.reference or patterns.old:
            return False
        path = project.module_file(module, self.module.path, level)
        if path is None or project.is_parsed(path):
            return False
        sketch = project.sketch_at(path)
        if sketch is None:
            return False
        if (None, name) in sketch.functions:
            return not roles.sketch_may_compute_kl(sketch, None, name)
        return sketch.plain_class(name)

    def function_given(self, expr: cst.BaseExpression) -> Value:
        """A function passed as a value (to ``functools.partial``, to
        ``checkpoint``): an imported one resolved to its definition."""
        function = self.eval(expr)
        if isinstance(function, Unknown) and function.module is not None:
            function = (
                self.context.project.function_at(function.module, self.module.path) or function
            )
        return function

    def partial(self, args: list[cst.Arg], kwargs: dict[str, cst.BaseExpression]) -> FuncRef | None:
        """``functools.partial(kl_penalty, kind="mse")``: the function with
        arguments given in advance."""
        function = self.function_given(args[0].value)
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
        if name == "cat" and args:
            rejoined = _rejoined(self.eval(args[0].value))
            if rejoined is not None:
                return rejoined
        if name == "stack" and args:
            columns = _accumulated_columns(args, kwargs)
            if columns is not None:
                # ``torch.stack(list(accumulate(x.unbind(-1))), dim=-1)``: each
                # step's sum of the columns so far, x's forward running sum.
                return self.lift1(
                    self.eval(columns), lambda n: ir.CumSum(n, False, origin=self.origin(call))
                )
        if name in lowering.GATHERS_INTO and len(args) >= 2 and isinstance(args[0].value, cst.Name):
            buffers = args[0].value.value
            held = self.env.get(buffers)
            if isinstance(held, Seq) or (
                isinstance(held, Unknown) and held.names[:1] == ("comprehension",)
            ):
                # ``dist.all_gather(chunks, local)``: every rank's tensor copied
                # into buffers, without a graph (``torch.distributed.nn.functional
                # .all_gather(local)`` returns them with one).
                copied = self.lift1(self.eval(args[1].value), ir.detach)
                self.env[buffers] = Seq([copied], appended=True, gathered=True)
                return Py(None)
        if name == "checkpoint" and args:
            # ``torch.utils.checkpoint.checkpoint(fn, *inputs)``: ``fn(*inputs)``,
            # its activations recomputed in the backward pass.
            function = self.function_given(args[0].value)
            if isinstance(function, FuncRef):
                inputs = [
                    a
                    for a in call.args[1:]
                    if a.keyword is None or a.keyword.value not in lowering.CHECKPOINT_OPTIONS
                ]
                return self.inline(function, call, arguments=inputs)
        if name in lowering.NEGATED_LOG_PROBS and args:
            negated = self.negated_log_prob(call, name, args, kwargs)
            if negated is not None:
                return negated
        if name in lowering.CATEGORICAL and "logits" in kwargs:
            logits = kwargs["logits"]
            given = self.eval(logits)
            return self.logprob_call(
                call,
                "log_softmax",
                [cst.Arg(value=logits)],
                argument=given if isinstance(given, Unknown) else None,
            )
        module = library.loss_module(name)
        if module is not None:
            # ``nn.KLDivLoss(reduction="none", log_target=True)``: an object whose
            # call is ``F.kl_div`` with these settings.
            return replace(module, preset_kwargs={k: self.eval(v) for k, v in kwargs.items()})
        if name in lowering.CATEGORICAL and "probs" in kwargs:
            # ``Categorical(probs=torch.softmax(logits, -1))``: its log-probs.
            given = self.eval(kwargs["probs"])
            if isinstance(given, (ir.Node, Choice)):
                return self.lift1(given, lowering.log_of_probability)
        if name in lowering.OPAQUE_FUNCTIONS:
            return ir.Opaque(f"torch.{name}")
        arg_values = [self.eval(a.value) for a in args]
        kw_values = {k: self.eval(v) for k, v in kwargs.items()}
        if name == "kl_divergence":
            # ``kl_divergence(Categorical(logits=logits), Categorical(logits=ref_logits))``:
            # distributions built in the call, named by their logits.
            arg_values = [
                self.named_by_source(v)
                if isinstance(v, Unknown) and v.distribution and v.logprob_op and v.names
                else v
                for v in arg_values
            ]
        if arg_values and isinstance(arg_values[0], Unknown):
            by_hand = lowering.normaliser_by_hand(name, arg_values[0], call)
            if by_hand is not None:
                return by_hand
        if name in LOGPROB_OPS or name in ("log_softmax", "softmax"):
            first = arg_values[0] if arg_values else None
            return self.logprob_call(
                call, name, args, argument=first if isinstance(first, Unknown) else None
            )
        return lowering.torch_function(self.torch_call(call), name, arg_values, kw_values)

    def negated_log_prob(
        self,
        call: cst.Call,
        name: str,
        args: list[cst.Arg],
        kwargs: dict[str, cst.BaseExpression],
    ) -> Value | None:
        """``F.cross_entropy(logits, ids, reduction="none")`` (or ``nll_loss`` of
        log-probs): minus the sampled token's log-prob, whose policy the
        logits say."""
        reduction = self.eval(kwargs["reduction"]) if "reduction" in kwargs else None
        if not (isinstance(reduction, Py) and reduction.value == "none"):
            return None
        if len(args) >= 2:
            target = self.eval(args[1].value)
            if has_distribution(target) or (isinstance(target, Unknown) and target.distribution):
                # ``F.cross_entropy(ref_logits, probs)`` with probabilities as
                # the target: a cross-entropy over the vocabulary, not minus
                # the sampled token's log-prob.
                return None
        first = self.eval(args[0].value)
        origin = self.origin(call)
        if has_distribution(first):
            # ``-F.nll_loss(log_softmax(logits), ids)``: log-probs already formed.
            return self.lift1(first, lambda n: ir.neg(lowering.to_token_level(n), origin))
        log_prob = self.logprob_call(
            call, name, args, argument=first if isinstance(first, Unknown) else None
        )
        if not isinstance(log_prob, Unknown):
            return None
        node = self.resolve(replace(log_prob, distribution=False))
        if (
            (not isinstance(node, ir.Node) or isinstance(node, ir.Opaque))
            and log_prob.names
            and log_prob.reference_model
        ):
            # ``-F.cross_entropy(logits, ids, reduction="none")`` of a helper's
            # own ``logits``, given the reference model's: the reference's.
            node = self.named_by_source(replace(log_prob, distribution=False))
        elif (not isinstance(node, ir.Node) or isinstance(node, ir.Opaque)) and log_prob.names:
            # Of logits no reference model gave (``token_nll(logits, ids)`` of
            # the trained model's): the policy's, with its gradient unless cut.
            atom: ir.Node = ir.Atom(Role.POLICY_LOGP, _source_name(log_prob), per_token=True)
            node = ir.detach(atom) if log_prob.detached or self.no_grad else atom
        if not isinstance(node, ir.Node) or isinstance(node, ir.Opaque):
            return None
        return ir.neg(node, origin)

    def named_by_source(self, log_probs: Unknown) -> Value:
        """Log-probs computed in an expression, not assigned to a name, named
        by what they were computed from (``logits``, not ``.transpose``); of
        a teacher's or a reference's logits, by that model
        (``self.teacher_model(...).logits`` given to a helper's ``logits``)."""
        return self.resolve(log_probs, _model_named(log_probs) or _source_name(log_probs))

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
        if name in lowering.WHITENERS and args:
            whitened = self.eval(args[0].value)
            by = self.eval(args[1].value) if len(args) > 1 else None
            shift = self.eval(kwargs["shift_mean"]) if "shift_mean" in kwargs else Py(True)
            if isinstance(whitened, ir.Node) and isinstance(shift, Py):
                by_mask = self.as_node(by) if by is not None else None
                return lowering.whitened(whitened, by_mask, bool(shift.value))
        credited = self.advantage_estimator(name, call)
        if credited is not None:
            return credited
        held = self.mapping_built(name, args)
        if held is not None:
            return held
        assumed = self.assumed_reduction(call)
        if assumed is not None:
            return assumed
        return Unknown(code(call), (name,), call=True, reference_model=self._reference_args(call))

    def mapping_built(self, name: str, args: list[cst.Arg]) -> DictVal | None:
        """``TensorDict({"loss_kl": ...}, batch_size=[])``: a mapping class of
        a framework built from a dict holds that dict's entries."""
        if not (name[:1].isupper() and args and isinstance(args[0].value, cst.Dict)):
            return None
        held = self.eval(args[0].value)
        return held if isinstance(held, DictVal) else None

    def assumed_reduction(self, call: cst.Call) -> Value | None:
        """A call kllint cannot follow (a callable attribute, a parameter, a
        function of another library) given a differentiable KL estimate: on
        its way into a loss that is almost always a reduction (``masked_mean``,
        ``self.masked_aggregator``, ``sum_of_sample_mean``), so value and
        gradient pass through as a masked mean, and the finding says so.
        Losing the flow must not lose the term."""
        if isinstance(call.func, cst.Call) and self._given_an_estimator(call.func):
            # ``compose(mask, token_sum, k2, mean)(log_ratio)``: a function
            # built from the project's functions may apply an estimator.
            return None
        estimates = []
        scores = []
        for arg in call.args:
            if arg.star or not _without_calls(arg.value):
                continue  # evaluating a nested call again would cost an inlining
            value = self.eval(arg.value)
            if isinstance(value, ir.Node) and value.has_role(Role.POLICY_LOGP):
                scores.append(value)
            if isinstance(value, (ir.Node, Choice)) and (
                _differentiable_kl(value) or (_behaviour_kl(value) and self._assigned_to_a_loss())
            ):
                estimates.append(value)
        if len(estimates) != 1:
            return None
        estimate = estimates[0]
        if isinstance(estimate, ir.Node) and _credited(estimate):
            # ``policy_loss_fn(log_probs, old_log_probs, returns, mask)``: a
            # loss given rewards-to-go and the policy's log-probs weighs the
            # log-probs' gradient by them (a policy-gradient loss, whatever
            # its clipping), it does not reduce them.
            if len(scores) != 1 or not ir.depends_on_policy(scores[0]):
                return None
            origin = replace(
                self.origin(call),
                assumed=f"`{full_code(call.func)}` could not be followed: taken for a "
                "policy-gradient loss of the log-probs weighted by the returns it is given",
            )
            weighted = ir.policy_gradient(estimate, scores[0], origin)
            return ir.Reduce("mean", ir.Axis.ALL, weighted, origin=origin)
        origin = replace(
            self.origin(call),
            assumed=f"`{full_code(call.func)}` could not be followed: taken for a reduction "
            "that passes the KL estimate's value and gradient through",
        )
        return self.lift1(estimate, lambda n: ir.Reduce("mean", ir.Axis.ALL, n, origin=origin))

    def _given_an_estimator(self, factory: cst.Call) -> bool:
        """A call given a function of the project (``compose(k2, mask,
        sum)``): one that may compute a KL estimate of what it is given,
        whatever its name (``def k2(x): return 0.5 * x.square()``)."""
        for arg in factory.args:
            given = self.eval(arg.value)
            refs = given.items if isinstance(given, Seq) else [given]
            if any(isinstance(ref, FuncRef) for ref in refs):
                return True
        return False

    def _assigned_to_a_loss(self) -> bool:
        """The statement being run names its value a loss (``kl_loss = ...``)."""
        return any(sinks.is_loss_name(name) for name in assigned_names(self.statement))

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
        func_names = chain_names(call.func)
        # ``AutoModelForCausalLM.from_pretrained(args.base_model)`` loads the
        # policy and the reference alike: where the weights come from says
        # nothing of which one a model is (its variable's name does).
        names = (
            []
            if "from_pretrained" in func_names
            else [n for a in call.args for n in chain_names(_unscaled(a.value))]
        )
        # Inside a helper, ``model(ids)`` is the reference model when the
        # caller passed one (``_lp(self.ref_model, ids)``): the parameter
        # holds what the caller named it (its last name: ``ref_policy``, not
        # the ``from_pretrained`` it was built with), and what that model
        # returned (``out.log_softmax(-1)``) stays the reference's.
        base = call.func
        while isinstance(base, (cst.Attribute, cst.Call, cst.Subscript)):
            base = base.func if isinstance(base, cst.Call) else base.value
        bound = self.env.get(base.value) if isinstance(base, cst.Name) else None
        if isinstance(bound, Unknown):
            if bound.reference_model:
                return True
            names.extend(bound.names[-1:])
        patterns = self.context.role_patterns
        copies = self.context.module.frozen_copies | self.module.frozen_copies
        if any(n in copies and patterns.role_from_words(n) is None for n in names + func_names):
            # ``self.snapshot(ids)`` of a frozen ``deepcopy`` of the policy
            # (a name with behaviour words, ``policy_old``, stays one).
            return True
        return patterns.is_reference_model(names + func_names)

    def logprob_call(
        self,
        call: cst.Call,
        name: str,
        args: list[cst.Arg],
        receiver: Unknown | None = None,
        *,
        argument: Unknown | None = None,
    ) -> Value:
        """``argument``: the first argument already evaluated (``F.log_softmax(
        model(ids).logits[:, start:-1].float())``), whose cut along time makes
        the log-probs per token. A ``softmax`` gives probabilities: the exp of
        the log-probs, whose policy is found the same way."""
        nested = receiver or argument
        if name == "logsumexp" and nested is not None and nested.names[:1] == ("logsumexp",):
            # ``torch.stack([chunk.logsumexp(-1) for chunk in ...], -1).logsumexp(-1)``:
            # the logsumexp of the chunks' logsumexps is the whole tensor's.
            return replace(nested, text=code(call))
        hints = [n for a in args[:1] for n in chain_names(_unscaled(a.value))]
        if receiver is not None and isinstance(call.func, cst.Attribute):
            # ``logits.logsumexp(dim=-1)``: the tensor is the receiver.
            hints = chain_names(call.func.value) + hints
        if any(roles.names_a_critic(h) and roles.names_logits(h) for h in hints):
            # ``F.log_softmax(value_logits)``: a categorical critic's value bins.
            return Unknown(code(call), (name, "critic"), call=True)
        if receiver is not None and any(
            roles.has_words(n, roles.REWARD_MODEL_WORDS) for n in receiver.names
        ):
            # ``self.prm.log_probs(ids)``: a reward model's own log-probs (PRIME's
            # implicit process reward), data for a score, not the policy's.
            return Unknown(code(call), ("reward model",), call=True)
        source = receiver or argument
        first = _unscaled(args[0].value) if args else None
        if source is None and isinstance(first, cst.Name):
            named = self.env.get(first.value)
            source = named if isinstance(named, Unknown) else None
        # ``a.log_softmax(-1)`` in a helper given ``logits``: the logits the
        # caller named, whatever the parameter is called.
        given = [n for n in (source.names if source else ()) if roles.names_logits(n)]
        return Unknown(
            code(call),
            (name, *given, *hints, *(["probs"] if name == "softmax" else [])),
            call=True,
            # ``F.log_softmax(logits)`` in a helper given ``ref_model(ids).logits``:
            # the log-probs of the reference's logits are the reference's.
            reference_model=self._reference_args(call)
            or (
                source is not None
                and (
                    source.reference_model
                    # ``token_probs(ref_logits, ids)``: the logits the caller named.
                    or self.context.role_patterns.is_reference_model(source.names)
                )
            ),
            logprob_op=True,
            distribution=name in ("log_softmax", "softmax"),
            per_token=any(s is not None and s.per_token for s in (source, argument)),
            # Of logits computed under ``no_grad``: without gradient too.
            detached=any(s is not None and s.detached for s in (source, argument)),
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
        if method in lowering.SIZE_METHODS and receiver.module is None:
            return ir.Atom(Role.COEFFICIENT, code(call))
        if method == lowering.DISTRIBUTION_LOGPROB:
            return Unknown(
                code(call),
                (*receiver.names, method),
                call=True,
                reference_model=receiver.reference_model
                or self.context.role_patterns.is_reference_model(receiver.names),
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
        if roles.is_logprob_name(method) or method in LOGPROB_OPS or method == "softmax":
            return self.logprob_call(call, method, args, receiver)
        credited = self.advantage_estimator(method, call)
        if credited is not None:
            return credited
        key = _string_key(args)
        if (
            key is None
            and method == "get"
            and len(args) == 1
            and isinstance(args[0].value, cst.Attribute)
        ):
            # ``td.get(self.tensor_keys.sample_log_prob)``: a key held in a
            # settings object of string fields (TorchRL's ``_AcceptedKeys``).
            named = self.eval(args[0].value)
            if isinstance(named, Py) and isinstance(named.value, str):
                key = named.value
        if method in ("get", "pop") and key is not None and len(args) == 1:
            # ``rollout_data.get("ref_log_probs")`` reads an entry as a subscript
            # does. With a default (``data.get("logprobs", curr_logprobs)``) it
            # may be what the caller computed, with its gradient.
            written = self.context.read(receiver, key)
            return written if written is not None else self.entry(receiver, key, code(call))
        if method == "get" and key is not None and len(args) == 2 and not receiver.call:
            # ``cfg.get("kl_type", "k3")``: the package's default for that
            # setting, else the fallback given here (a selector's literal).
            setting = self.setting_default(receiver, key)
            if setting is not None:
                return setting
            fallback = self.eval(args[1].value)
            if isinstance(fallback, Py) and isinstance(fallback.value, str):
                return fallback
        assumed = self.assumed_reduction(call)
        if assumed is not None:
            return assumed
        return Unknown(
            code(call),
            (*receiver.names, method),
            call=True,
            # ``micro_batches = data.split(n)``: pieces of the same batch, whose
            # entries (``data.batch["advantages"] = ...``) each piece holds.
            same_as=(receiver.same_as or receiver) if method in SPLITS else None,
            # ``logits.float()`` in a helper given the teacher's logits: still the teacher's.
            reference_model=receiver.reference_model
            or self._reference_args(call)
            or self.context.role_patterns.is_reference_model(receiver.names),
        )

    # ----------------------------------------------------------------- tensor operations

    def of_sequence_rows(self, expr: cst.BaseExpression) -> bool:
        """Arithmetic on loop variables that each hold one response of a
        packed tensor (``lp - ref`` of ``zip(lp_chunks, ref_chunks)``)."""
        names = _names_of(expr)
        return bool(names) and all(n in self.sequence_rows for n in names)  # type: ignore[union-attr]

    def one_row(self, expr: cst.BaseExpression) -> bool:
        """``logps[i, :n]`` with ``i`` a loop's counter (``enumerate``,
        ``range``) or a number: one sample's row, cut along time."""
        if not isinstance(expr, cst.Subscript) or len(expr.slice) != 2:
            return False
        row, columns = (element.slice for element in expr.slice)
        if not isinstance(row, cst.Index) or not isinstance(columns, cst.Slice):
            return False
        picked = self.eval(row.value)
        if not (isinstance(picked, Py) and isinstance(picked.value, int)) and not (
            isinstance(picked, Unknown) and picked.names[:1] in (("index",), ("loop",))
        ):
            return False
        # Of per-token values: a row of sequence-level ones (``[G, n]`` rewards
        # of a group) is a group's samples, not a response's tokens.
        tensor = self.eval(expr.value)
        return isinstance(tensor, ir.Node) and all(
            not (isinstance(n, ir.Reduce) and n.axis is not ir.Axis.BATCH)
            and not (isinstance(n, ir.Atom) and n.level is not ir.Level.TOKEN)
            for n in tensor.walk()
        )

    def method_op(
        self,
        name: str,
        receiver: Value,
        args: list[cst.Arg],
        kwargs: dict[str, cst.BaseExpression],
        call: cst.Call,
    ) -> Value:
        """``receiver.name(*args, **kwargs)`` on a tensor, arguments evaluated."""
        if (
            name in lowering.REDUCTIONS
            and not args
            and not kwargs
            and isinstance(call.func, cst.Attribute)
            and (self.of_sequence_rows(call.func.value) or self.one_row(call.func.value))
        ):
            # ``[x.sum() for x in log_ratio.split(response_lengths)]``, also
            # ``(lp - ref).sum()`` of two such rows, or ``logps[i, :n]``:
            # one response's tokens, whose one axis is time.
            kwargs = {"dim": cst.Integer("1")}
        return lowering.tensor_method(
            self.torch_call(call),
            name,
            receiver,
            [self.eval(a.value) for a in args],
            {k: self.eval(v) for k, v in kwargs.items()},
        )


def _names_of(expr: cst.BaseExpression) -> list[str] | None:
    """The names arithmetic on names reads (``lp - ref``, ``(x * m)``); None
    for anything else (a call, an attribute)."""
    if isinstance(expr, cst.Name):
        return [expr.value]
    if isinstance(expr, (cst.Integer, cst.Float)):
        return []
    if isinstance(expr, cst.BinaryOperation):
        left, right = _names_of(expr.left), _names_of(expr.right)
        return None if left is None or right is None else left + right
    if isinstance(expr, cst.UnaryOperation):
        return _names_of(expr.expression)
    if (
        isinstance(expr, cst.Call)
        and isinstance(expr.func, cst.Attribute)
        and (
            expr.func.attr.value in UNARY
            or expr.func.attr.value in TENSOR_IDENTITY
            or expr.func.attr.value in lowering.BINARY_METHODS
        )
    ):
        # ``(lp - ref).pow(2)``: element by element, as the arithmetic is.
        names = [_names_of(expr.func.value), *(_names_of(a.value) for a in expr.args)]
        return None if any(n is None for n in names) else [n for ns in names for n in ns]  # type: ignore[union-attr]
    return None


def _without_calls(expr: cst.BaseExpression) -> bool:
    """A named value or arithmetic on named values (``kl * loss_mask``)."""
    if isinstance(expr, (cst.Name, cst.Attribute, cst.Subscript, cst.Integer, cst.Float)):
        return True
    if isinstance(expr, cst.BinaryOperation):
        return _without_calls(expr.left) and _without_calls(expr.right)
    if isinstance(expr, cst.UnaryOperation):
        return _without_calls(expr.expression)
    return False


def _behaviour_kl(value: Value) -> bool:
    """A KL estimate of the rollout's log-probs against the reference's, with
    no gradient path: reduced into a loss (``kl_loss = reduce(kl * mask)``)
    it is KL005's term, lost if the unknown reducer dropped it."""
    if isinstance(value, Choice):
        return any(_behaviour_kl(v) for _, v in value.options)
    return (
        isinstance(value, ir.Node)
        and value.has_role(Role.REFERENCE_LOGP)
        and value.has_role(Role.OLD_LOGP)
        and not ir.depends_on_policy(value)
    )


def _copied_out(value: Value) -> bool:
    """An array copied out of a tensor (``lp.detach().cpu().numpy()``, and
    arithmetic on such arrays): values without a graph. A tensor handed to
    NumPy as it is (``np.asarray(logps)``) is not followed."""
    return (
        isinstance(value, ir.Node)
        and not ir.depends_on_policy(value)
        and any(ir.is_detached(node) for node in value.walk())
    )


def _credited(value: ir.Node) -> bool:
    """Rewards turned into returns (a reward-to-go) with no gradient: what
    a policy-gradient loss weighs log-probs by."""
    return ir.is_detached(value) and ir.reaches(
        value, lambda n: isinstance(n, ir.CumSum) and n.reverse, lambda n: False
    )


def _differentiable_kl(value: Value) -> bool:
    """A value that holds the reference log-prob and a gradient path to the
    policy: a KL estimate being optimised (not a stored reward)."""
    if isinstance(value, Choice):
        return any(_differentiable_kl(v) for _, v in value.options)
    return (
        isinstance(value, ir.Node)
        and value.has_role(Role.REFERENCE_LOGP)
        and ir.depends_on_policy(value)
    )


def _record_class(cls: ClassInfo) -> bool:
    """A dataclass or ``NamedTuple`` (annotated fields, no ``__init__`` of its
    own): calling it builds a record of what it is given."""
    return "__init__" not in cls.methods and any(f.annotated for f in cls.fields)


def _has_methods(cls: ClassInfo) -> bool:
    """Methods of its own besides dunders (``__post_init__``, ``__repr__``),
    or ``__call__``: an object called (a reward shaper) is more than a record."""
    return any(
        name == "__call__" or not (name.startswith("__") and name.endswith("__"))
        for name in cls.methods
    )


def _callable_class(project: Project, cls: ClassInfo, module: ModuleInfo) -> bool:
    """A class whose objects are called (an nn.Module's ``forward``): worth
    building, so that the call sees the attributes ``__init__`` set."""
    return any(project.method(cls, module, name) is not None for name in ("forward", "__call__"))


def _squeezes_the_batch(receiver: Unknown, args: list[cst.Arg]) -> bool:
    """``logits.squeeze(0)`` of a model's ``[1, T, V]`` output."""
    return (
        len(args) == 1
        and isinstance(args[0].value, cst.Integer)
        and args[0].value.value == "0"
        and bool(receiver.names)
        and receiver.names[-1] == "logits"
        and receiver.call
    )


def _string_key(args: list[cst.Arg]) -> str | None:
    """The literal string key a call starts with (``.get("kl_type", ...)``)."""
    if args and args[0].keyword is None and isinstance(args[0].value, cst.SimpleString):
        key = args[0].value.evaluated_value
        return key if isinstance(key, str) else None
    return None


def _is_enum(cls: ClassInfo) -> bool:
    """``class KLType(str, enum.Enum)`` and the like, by its bases as written."""
    return any(base.rpartition(".")[2].endswith("Enum") for base in cls.bases)


def _unscaled(expr: cst.BaseExpression) -> cst.BaseExpression:
    """The logits of ``teacher_logits / temperature`` (or ``* scale``): a
    temperature does not change whose logits they are."""
    while isinstance(expr, cst.BinaryOperation) and isinstance(
        expr.operator, (cst.Divide, cst.Multiply)
    ):
        expr = expr.left
    return expr


def _accumulated_columns(
    args: list[cst.Arg], kwargs: dict[str, cst.BaseExpression]
) -> cst.BaseExpression | None:
    """``x`` of ``torch.stack(list(itertools.accumulate(x.unbind(-1))), dim=-1)``:
    the time columns of ``x`` summed so far at each step (Python's
    ``accumulate`` adds by default), stacked back along the same axis."""
    rows = args[0].value
    if isinstance(rows, cst.Call) and dotted_name(rows.func) in ("list", "tuple") and rows.args:
        rows = rows.args[0].value
    if not (
        isinstance(rows, cst.Call)
        and dotted_name(rows.func) in ("accumulate", "itertools.accumulate")
        and len(rows.args) == 1
    ):
        return None
    columns = rows.args[0].value
    cut = lowering.method_axis(columns, "unbind")
    dim = kwargs.get("dim", args[1].value if len(args) > 1 else None)
    stacked = int_literal(dim) if dim is not None else 0
    if cut not in (-1, 1) or stacked != cut:
        return None
    assert isinstance(columns, cst.Call) and isinstance(columns.func, cst.Attribute)
    return columns.func.value


def _rejoined(pieces: Value) -> Value | None:
    """``torch.cat([log_softmax(c) for c in logits.split(k, dim=1)], dim=1)``:
    the chunks of one tensor, each computed alike, joined back: what one chunk
    is, the whole is. Pieces that differ (``cat([chosen, rejected])``) stay
    opaque. A list each branch filled its own way (the returns of
    ``gamma == 1.0`` or of a discounted loop) is rejoined on each."""
    if isinstance(pieces, Choice):
        # A list some path appended to (``if beta > 0: kl_terms.append(...)``):
        # a path that left it empty cannot concatenate it, so it does not reach here.
        joined = [
            (label, _rejoined(option))
            for label, option in pieces.options
            if not (isinstance(option, Seq) and not option.items)
        ]
        if joined and all(whole is not None for _, whole in joined):
            return choice(joined)  # type: ignore[arg-type]
        return None
    if (
        isinstance(pieces, Unknown)
        and not pieces.call
        and pieces.names
        and roles.is_logprob_name(pieces.names[-1])
    ):
        # ``torch.cat(log_probs)`` of a list of per-response log-probs kllint
        # does not hold (slime's rows, one 1-D tensor each): the same
        # log-probs on one flat token axis: per token.
        return replace(pieces, per_token=True)
    if not isinstance(pieces, Seq) or not pieces.items:
        return None
    first = pieces.items[0]
    if not isinstance(first, (Unknown, ir.Node, Choice)):
        return None
    for piece in pieces.items[1:]:
        if isinstance(first, Unknown):
            if piece != first:
                return None
        elif _shape_of_piece(piece) != _shape_of_piece(first):
            return None
    return first


def _shape_of_piece(piece: Value) -> object:
    """What two chunks computed alike share: their IR's structure, on each
    path of a choice (a dtype branch in the helper that made them)."""
    if isinstance(piece, ir.Node):
        return ir.structure(piece)
    if isinstance(piece, Choice):
        return tuple((label, _shape_of_piece(option)) for label, option in piece.options)
    return object()  # never equal: a piece kllint cannot compare


def _factor_of(grad: ir.Node, grad_output: ir.Atom) -> ir.Node | None:
    """``f`` when ``grad`` is ``grad_output * f`` (up to signs, products
    and divisors that do not hold ``grad_output``); None otherwise."""
    if grad is grad_output:
        return ir.Const(1.0)
    if isinstance(grad, ir.Unary) and grad.op == "neg":
        inner = _factor_of(grad.arg, grad_output)
        return ir.neg(inner) if inner is not None else None
    if isinstance(grad, ir.Binary) and grad.op in ("mul", "div"):
        left, right = ir.contains(grad.left, grad_output), ir.contains(grad.right, grad_output)
        if left and not right:
            inner = _factor_of(grad.left, grad_output)
            return ir.binary(grad.op, inner, grad.right) if inner is not None else None
        if right and not left and grad.op == "mul":
            inner = _factor_of(grad.right, grad_output)
            return ir.binary("mul", grad.left, inner) if inner is not None else None
    return None


def _calls_super(expr: cst.BaseExpression) -> bool:
    """``super()`` (or ``super(Cls, self)``)."""
    return (
        isinstance(expr, cst.Call)
        and isinstance(expr.func, cst.Name)
        and expr.func.value == "super"
    )


def _a_number(value: Value) -> bool:
    """A literal, a setting or arithmetic of them: nothing a gradient flows
    through (``step``, ``cfg.kl_warmup_steps``, ``1.0``)."""
    if isinstance(value, Py):
        return isinstance(value.value, (int, float)) and not isinstance(value.value, bool)
    if isinstance(value, ir.Node):
        # Not a call's result (``min(loss, cap)``): it may be a tensor.
        return ir.settings_only(value, unread_names=True)
    if isinstance(value, Unknown):
        return not roles.may_carry_kl(value) and roles.weight_role(
            value.names[-1] if value.names else value.text
        ) in (None, Role.COEFFICIENT)
    return False


_REMOTE_DECORATOR = re.compile(r"^[ \t]*@[\w.]*remote\b", re.MULTILINE)


def _ray_remote(decorators: Sequence[cst.Decorator]) -> bool:
    """``@ray.remote`` or ``@ray.remote(num_gpus=1)``."""
    for decorator in decorators:
        expr = decorator.decorator
        if isinstance(expr, cst.Call):
            expr = expr.func
        if (dotted_name(expr) or "").endswith("remote"):
            return True
    return False


def _model_named(log_probs: Unknown) -> str | None:
    """The teacher or reference model log-probs were computed by
    (``self.teacher_model(...).logits``), named so, else None."""
    named = [
        n
        for n in log_probs.names
        if roles.names_a_teacher(n) or roles.has_words(n, roles.REFERENCE_WORDS)
    ]
    return named[-1] if named else None


def _source_name(log_probs: Unknown) -> str:
    """What log-probs were computed from (``logits``, not ``.transpose``)."""
    named = [n for n in log_probs.names if n not in lowering.TENSOR_METHODS]
    return named[-1] if named else log_probs.names[-1]


# The ``operator`` module's arithmetic, as the interpreter names it.
_OPERATORS = {
    "add": "add",
    "iadd": "add",
    "sub": "sub",
    "isub": "sub",
    "mul": "mul",
    "imul": "mul",
    "truediv": "div",
    "itruediv": "div",
    "pow": "pow",
    "neg": "neg",
}


def _written_tuples(iterated: list[Value]) -> list[tuple[Value, ...]] | None:
    """The items of lists or tuples written out (not rows of a loop), taken
    together position by position, when all have the same length."""
    if not iterated or not all(
        isinstance(v, Seq) and not v.appended and len(v.items) > 1 for v in iterated
    ):
        return None
    lengths = {len(v.items) for v in iterated}  # type: ignore[union-attr]
    if len(lengths) != 1:
        return None
    return list(zip(*(v.items for v in iterated)))  # type: ignore[union-attr]


def _lists(expr: cst.BaseExpression) -> bool:
    """What ``list(...)`` is read through: a name, or rows that ``map``,
    ``zip`` or ``starmap`` make (not any call, which would be followed again)."""
    if isinstance(expr, (cst.Name, cst.Attribute)):
        return True
    return isinstance(expr, cst.Call) and (dotted_name(expr.func) or "").rpartition(".")[2] in (
        "map",
        "zip",
        "starmap",
        "reversed",
    )


def _row(value: Value) -> Value:
    """One row of what is iterated: a list's item, a tensor's own value."""
    if isinstance(value, Seq):
        return value.items[0] if value.items else value
    return value


def _names_a_value(expr: cst.BaseExpression) -> bool:
    """``data``, ``self.batch``, ``out["batch"]``: a variable, not a call
    (``dict(zip(keys, values))`` builds its entries some other way)."""
    return isinstance(expr, (cst.Name, cst.Attribute, cst.Subscript))
