"""Calls: of helpers of the project (inlined with their arguments bound),
of torch (lowered by the torch vocabulary), of methods on tensors and on
values kllint cannot compute, of ``.backward()`` (a sink)."""

from __future__ import annotations

from dataclasses import replace

import libcst as cst

from kllint.analysis import ir, lowering, roles, sinks
from kllint.analysis.expressions import Expressions
from kllint.analysis.ir import Role
from kllint.analysis.lowering import (
    AGGREGATORS,
    DETACHING,
    IN_PLACE,
    LOGPROB_OPS,
    MUTATING,
    TENSOR_IDENTITY,
    UNARY,
)
from kllint.analysis.syntax import chain_names, code, full_code
from kllint.analysis.values import (
    Choice,
    DictVal,
    Flipped,
    FuncRef,
    Py,
    Seq,
    Unknown,
    Value,
)


class Calls(Expressions):
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
        if method in lowering.LOSS_SCALING and isinstance(receiver, Unknown) and len(args) == 1:
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
            or method in lowering.ON_RESOLVED
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
        if method in lowering.SIZE_METHODS and receiver.module is None:
            return ir.Atom(Role.COEFFICIENT, code(call))
        if method == lowering.DISTRIBUTION_LOGPROB:
            return Unknown(
                code(call),
                (*receiver.names, method),
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
