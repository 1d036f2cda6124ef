"""Which functions of a project return a value that some caller backpropagates.

A helper such as ``per_token_terms(...)`` is not named like a loss, yet when
a trainer in another module writes ``loss = per_token_terms(...).mean()``
and then ``loss.backward()``, what the helper returns is minimised. This
module finds such helpers from the callers' side, with the stdlib ``ast``
over the files that can hold a backward pass, so that the helper can be
judged where it is written, when it is analysed on its own.

Within each function of a scanned file, the names that reach a backward pass
(``loss.backward()``, ``accelerator.backward(out.mean())``,
``strategy.backward(loss, model, optimizer)``, ``manual_backward``,
``scaler.scale(loss).backward()``, an ``optimizer_step`` given the loss) are
followed back through assignments (``loss = pg_loss + beta * kl``,
``losses.append(term)``); every call on those paths returns (part of) the
loss. A function whose return value is itself returned into such a path is
followed one caller further. Megatron-style pipelines pass the loss as a
callback: ``return output, partial(loss_func, ...)`` from the forward step
given to ``forward_backward_func``.

This is a flow-insensitive, name-level scan: a call is matched to a helper
by its name. It only ever adds sinks where a caller demonstrably
backpropagates a helper's result; logs, metrics and rewards never reach
these paths.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial

# Method names whose arguments (or receiver) are the loss being minimised.
BACKWARD_METHODS = frozenset({"backward", "manual_backward"})
# An optimiser step given the loss (``strategy.optimizer_step(optimizer, loss, model)``).
STEP_METHODS = frozenset({"optimizer_step"})
# Text a file must contain to be parsed at all.
MARKERS = ("backward", "optimizer_step")
# A call of one of them (not ``forward_backward_func``, not a comment's word).
_SINK_CALL = re.compile(r"\.(?:backward|manual_backward|optimizer_step)\s*\(")

_MAX_HOPS = 2  # callers of callers followed through returned values


@dataclass(frozen=True)
class Caller:
    """A call whose result reaches a backward pass."""

    function: str  # the calling function, ``train_step``
    path: str  # its file, absolute
    line: int  # the line of the call
    via: str  # how the result is minimised: "calls `.backward()`", ...
    # ``pg_loss, clipfrac, kl = helper(...)``: the returned tuple's elements
    # that reach the loss (None: the whole value).
    elements: tuple[int, ...] | None = None
    callback: bool = False  # passed as a loss function, never inlined by the caller
    # The callee's name is defined in the caller's own file: the call is to
    # that function, not to a namesake elsewhere in the project.
    local: bool = False


_Call = tuple[str, int, "tuple[int, ...] | None"]  # (callee, line, elements)


@dataclass
class _Function:
    name: str
    path: str
    # Calls whose result reaches a backward pass in this function: (callee, line, elements).
    backprop_calls: list[_Call]
    via: str
    # Calls whose result this function returns, by the element of a returned
    # tuple they reach (None: the whole value, or any element).
    returned_calls: dict[int | None, list[_Call]]
    # ``return output, partial(loss_func, ...)``: the callbacks it returns.
    returned_callbacks: list[tuple[str, int]]


def build_index(files: Iterable[tuple[str, str]]) -> dict[str, list[Caller]]:
    """``{helper name: [callers that backpropagate its result]}`` over
    ``(absolute path, source)`` pairs. Only files with a backward pass are
    parsed, and only their functions that hold one are scanned; then the
    functions the index names (to follow their results one caller further)."""
    sources = list(files)
    detaching = _detaching_functions(sources)
    parsed: set[str] = set()  # modules parsed whole
    blocks: set[tuple[str, int]] = set()  # (module, first line) of functions parsed alone
    definitions: dict[
        str, list[tuple[ast.FunctionDef | ast.AsyncFunctionDef, str, dict[str, str]]]
    ] = {}
    with_backward: list[tuple[ast.FunctionDef | ast.AsyncFunctionDef, str, dict[str, str]]] = []
    forward_steps: set[str] = set()
    scanned: dict[int, _Function] = {}

    def scan(
        fn: ast.FunctionDef | ast.AsyncFunctionDef, path: str, aliases: dict[str, str]
    ) -> _Function:
        if id(fn) not in scanned:
            scanned[id(fn)] = _scan_function(fn, path, aliases, detaching)
        return scanned[id(fn)]

    def add(
        fn: ast.FunctionDef | ast.AsyncFunctionDef, path: str, aliases: dict[str, str], text: str
    ) -> None:
        definitions.setdefault(fn.name, []).append((fn, path, aliases))
        if _SINK_CALL.search(text):
            with_backward.append((fn, path, aliases))

    def parse(path: str, source: str, wanted: Callable[[str, str], bool]) -> None:
        """The functions of ``path`` that ``wanted(name, text)`` selects, each
        parsed on its own (a large trainer module costs a fraction of a whole
        parse); the whole module when a block does not parse alone."""
        if path in parsed:
            return  # parsed whole already
        aliases = _import_aliases(source)
        lines = source.splitlines()
        if "forward_backward" not in source:
            trees = []
            alone: list[tuple[str, int]] = []
            for start, end in _function_blocks(lines):
                header = _DEF.match(lines[start])
                text = "\n".join(lines[start:end])
                if header is None or (path, start) in blocks or not wanted(header.group(2), text):
                    continue
                alone.append((path, start))
                indent = len(header.group(1))
                try:
                    # Blank lines in front keep the module's line numbers.
                    tree = ast.parse(
                        "\n" * start + "\n".join(line[indent:] for line in lines[start:end])
                    )
                except (SyntaxError, ValueError):
                    break
                trees.append(tree)
            else:
                blocks.update(alone)
                for tree in trees:
                    for fn in _functions(tree):
                        add(fn, path, aliases, "\n".join(lines[fn.lineno - 1 : fn.end_lineno]))
                return
        parsed.add(path)
        try:
            module = ast.parse(source)
        except (SyntaxError, ValueError):
            return
        for fn in _functions(module):
            if any(p == path and fn.lineno - 1 == start for p, start in blocks):
                continue
            add(fn, path, aliases, "\n".join(lines[fn.lineno - 1 : fn.end_lineno]))
        if "forward_backward" in source:
            forward_steps.update(_forward_step_functions(module))

    def holds_marker(name: str, text: str) -> bool:
        return _SINK_CALL.search(text) is not None

    for path, source in sources:
        if _SINK_CALL.search(source) or "forward_backward" in source:
            parse(path, source, holds_marker)

    source_of = dict(sources)
    local_names: dict[str, set[str]] = {}

    def defined_here(path: str, name: str) -> bool:
        if path not in local_names:
            text = source_of.get(path, "")
            local_names[path] = set(_DEF_NAME.findall(text)) | {
                instance_call(cls) for cls in _CLASS_NAME.findall(text)
            }
        return name in local_names[path]

    index: dict[str, list[Caller]] = {}
    for fn_node, path, aliases in with_backward:
        fn = scan(fn_node, path, aliases)
        for callee, line, elements in fn.backprop_calls:
            index.setdefault(callee, []).append(
                Caller(fn.name, fn.path, line, fn.via, elements, local=defined_here(path, callee))
            )
    for step in forward_steps:
        for fn_node, path, aliases in definitions.get(step, []):
            fn = scan(fn_node, path, aliases)
            for callee, line in fn.returned_callbacks:
                index.setdefault(callee, []).append(
                    Caller(
                        fn.name,
                        fn.path,
                        line,
                        "passes it to `forward_backward_func` as the loss",
                        callback=True,
                    )
                )
    # A helper whose result another function returns to a backward pass.
    followed: set[str] = set()
    defined_in: dict[str, list[tuple[str, str]]] | None = None  # name -> modules defining it
    for _ in range(_MAX_HOPS):
        pending = [name for name in index if name not in followed]
        if not pending:
            break
        followed.update(pending)
        if defined_in is None:
            defined_in = {}
            for path, source in sources:
                for name in set(_DEF_NAME.findall(source)):
                    defined_in.setdefault(name, []).append((path, source))
        chosen = frozenset(pending)
        for path, source in {p: s for name in pending for p, s in defined_in.get(name, [])}.items():
            parse(path, source, partial(_named, chosen))
        for name in pending:
            through = index[name][0]
            for fn_node, path, aliases in definitions.get(name, []):
                fn = scan(fn_node, path, aliases)
                returned = (
                    fn.returned_calls[None]
                    if through.elements is None
                    else [
                        call
                        for position in through.elements
                        for call in fn.returned_calls.get(position, [])
                    ]
                )
                for callee, line, elements in returned:
                    if callee in index:
                        continue
                    via = f"returns it to `{through.function}`, which {through.via}"
                    index[callee] = [
                        Caller(
                            fn.name, fn.path, line, via, elements, local=defined_here(path, callee)
                        )
                    ]
    return index


# ---------------------------------------------------------------- one function


def _scan_function(
    fn: ast.FunctionDef | ast.AsyncFunctionDef,
    path: str,
    aliases: dict[str, str],
    detaching: frozenset[str] = frozenset(),
) -> _Function:
    body = list(_own_nodes(fn))
    assignments: list[tuple[set[str], ast.expr, list[ast.expr]]] = []
    sink_exprs: list[ast.expr] = []
    via = ""
    for node in body:
        if isinstance(node, ast.Assign):
            assignments.append((_target_names(node.targets), node.value, node.targets))
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None:
            assignments.append((_target_names([node.target]), node.value, [node.target]))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            method = node.func.attr
            if method in BACKWARD_METHODS:
                sink_exprs.append(_backward_target(node))
                via = via or f"calls `.{method}()`"
            elif method in STEP_METHODS and node.args:
                sink_exprs.extend(node.args)
                via = via or f"calls `.{method}()` with it"
            elif (
                method in ("append", "extend", "add_")
                and isinstance(node.func.value, ast.Name)
                and node.args
            ):
                # ``losses.append(term)``: the list is assigned what it is given.
                assignments.append(({node.func.value.id}, node.args[0], [node.func.value]))

    backprop_calls = _calls_reaching(sink_exprs, assignments, aliases, detaching)
    returns = [n.value for n in body if isinstance(n, ast.Return) and n.value is not None]
    returned_calls: dict[int | None, list[_Call]] = {
        None: _calls_reaching(returns, assignments, aliases, detaching)
    }
    for value in returns:
        if isinstance(value, ast.Tuple):
            for position, element in enumerate(value.elts):
                returned_calls.setdefault(position, []).extend(
                    _calls_reaching([element], assignments, aliases, detaching)
                )
    callbacks = []
    for value in returns:
        if isinstance(value, ast.Tuple) and len(value.elts) == 2:
            name = _callback_name(value.elts[1], aliases)
            if name is not None:
                callbacks.append((name, value.lineno))
    return _Function(fn.name, path, backprop_calls, via, returned_calls, callbacks)


def _calls_reaching(
    roots: list[ast.expr],
    assignments: list[tuple[set[str], ast.expr, list[ast.expr]]],
    aliases: dict[str, str],
    detaching: frozenset[str] = frozenset(),
) -> list[_Call]:
    """Every call whose result flows into one of ``roots``, through the
    function's assignments (a fixed point over names: order and branches are
    ignored, as a name reaching the loss on any path is enough)."""
    if not roots:
        return []
    names: set[str] = set()
    for root in roots:
        names |= _names(root, detaching)
    reached: list[int] = []
    changed = True
    while changed:
        changed = False
        for index, (bound, value, _) in enumerate(assignments):
            if index not in reached and bound & names:
                reached.append(index)
                names |= _names(value, detaching)
                changed = True
    found = [c for root in roots for c in _calls(root, None, aliases, detaching)]
    for index in reached:
        _, value, targets = assignments[index]
        found.extend(_calls(value, _elements(targets, names), aliases, detaching))
    return found


def _elements(targets: list[ast.expr], names: set[str]) -> tuple[int, ...] | None:
    """``pg_loss, clipfrac, kl = helper(...)``: the positions of the names
    that reach the loss."""
    if len(targets) == 1 and isinstance(targets[0], ast.Tuple):
        return tuple(
            position
            for position, element in enumerate(targets[0].elts)
            if isinstance(element, ast.Name) and element.id in names
        )
    return None


def _calls(
    expr: ast.expr,
    elements: tuple[int, ...] | None,
    aliases: dict[str, str],
    detaching: frozenset[str] = frozenset(),
) -> Iterator[_Call]:
    """The project calls in an expression, by callee name. Only the call the
    value *is* (possibly under arithmetic and reductions) keeps ``elements``."""
    for node in _linear_nodes(expr, detaching)[0]:
        if isinstance(node, ast.Call):
            name = _callee(node.func, aliases)
            if name is not None and name not in _GENERIC:
                yield name, node.lineno, elements if node is expr else None


def _callee(func: ast.expr, aliases: dict[str, str]) -> str | None:
    if isinstance(func, ast.Name):
        return aliases.get(func.id, func.id)
    if isinstance(func, ast.Attribute):
        if isinstance(func.value, ast.Name) and func.value.id == "self":
            return aliases.get(f"self.{func.attr}", func.attr) or None
        return func.attr
    return None


# Tensor methods and builtins: calls on the way to a loss that are never a
# project's helper (kept out of the index, which stays small).
_GENERIC = frozenset(
    {
        "mean",
        "sum",
        "float",
        "to",
        "view",
        "reshape",
        "squeeze",
        "unsqueeze",
        "contiguous",
        "clone",
        "masked_fill",
        "clamp",
        "clamp_min",
        "flatten",
        "max",
        "min",
        "cuda",
        "cpu",
        "type_as",
        "half",
        "bfloat16",
        "long",
        "int",
        "bool",
        "size",
        "numel",
        "len",
        "range",
        "zip",
        "enumerate",
        "isinstance",
        "getattr",
        "dict",
        "list",
        "tuple",
        "str",
        "stack",
        "cat",
        "where",
        "zeros_like",
        "ones_like",
        "tensor",
        "get",
        "pop",
        "items",
        "values",
        "keys",
        "append",
        "expand",
        "expand_as",
        "permute",
        "transpose",
        "gather",
        "take_along_dim",
        "mul",
        "add",
        "sub",
        "div",
        "neg",
        "nansum",
        "nanmean",
        "masked_select",
        "scale",
        "backward",
    }
)


def _callback_name(expr: ast.expr, aliases: dict[str, str]) -> str | None:
    if isinstance(expr, ast.Call) and _callee(expr.func, aliases) == "partial" and expr.args:
        return _callee(expr.args[0], aliases)
    if isinstance(expr, (ast.Name, ast.Attribute)):
        return _callee(expr, aliases)
    return None


def _backward_target(call: ast.Call) -> ast.expr:
    """``loss.backward()``, ``accelerator.backward(loss)``,
    ``scaler.scale(loss).backward()``: the loss."""
    if call.args:
        return call.args[0]
    assert isinstance(call.func, ast.Attribute)
    receiver = call.func.value
    if (
        isinstance(receiver, ast.Call)
        and isinstance(receiver.func, ast.Attribute)
        and receiver.func.attr == "scale"
        and receiver.args
    ):
        return receiver.args[0]
    return receiver


# ``kl.detach()``, ``kl.item()``: what these return carries no gradient.
_CUTS = frozenset({"detach", "item", "tolist", "numpy"})
# ``estimate_kl(...)[config.kl_estimator]``: a runtime choice among the
# results; which one reaches the loss only the caller can say.
_SELECTORS = (ast.Name, ast.Attribute, ast.Call)
# A caller that builds its own estimator from a helper's result
# (``kl.exp() - 1 - kl`` from a returned log-ratio) minimises that estimator,
# not the result: the result is a loss only through linear steps and
# reductions (sums, means, coefficients, unknown helpers taken as reductions).
_NONLINEAR = frozenset(
    {
        "exp",
        "expm1",
        "log",
        "log1p",
        "pow",
        "sqrt",
        "square",
        "sigmoid",
        "softplus",
        "abs",
        "logsumexp",
        "softmax",
        "log_softmax",
        "tanh",
        "relu",
    }
)


def _linear_nodes(
    expr: ast.AST, detaching: frozenset[str] = frozenset()
) -> tuple[list[ast.AST], set[str]]:
    """The nodes of an expression that its value depends on linearly (with a
    gradient), and the names it uses non-linearly. ``detaching``: the
    project's functions that detach what they are given."""
    linear: list[ast.AST] = []
    nonlinear: set[str] = set()
    stack = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Compare) or (
            isinstance(node, ast.Subscript) and isinstance(node.slice, _SELECTORS)
        ):
            continue
        if isinstance(node, ast.Call):
            name = _callee(node.func, {})
            if name in _CUTS or name in detaching:
                continue
            if name in _NONLINEAR:
                nonlinear |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
                continue
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            nonlinear |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            continue
        linear.append(node)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            stack.append(node.left)  # ``loss / n``; a tensor divisor is no loss
        else:
            stack.extend(ast.iter_child_nodes(node))
    return linear, nonlinear


# The instance is not a value that flows: ``self.beta * kl`` does not make
# every ``self.x = ...`` part of the loss.
_NOT_VALUES = frozenset({"self", "cls"})


def _names(expr: ast.AST, detaching: frozenset[str] = frozenset()) -> set[str]:
    linear, nonlinear = _linear_nodes(expr, detaching)
    return {
        n.id
        for n in linear
        if isinstance(n, ast.Name) and n.id not in _NOT_VALUES and n.id not in nonlinear
    }


def _target_names(targets: list[ast.expr]) -> set[str]:
    """Names bound by assignment targets; ``out["loss"] = x`` binds ``out``."""
    names: set[str] = set()
    for target in targets:
        for node in ast.walk(target):
            if isinstance(node, ast.Name) and node.id not in _NOT_VALUES:
                names.add(node.id)
    return names


def _forward_step_functions(tree: ast.Module) -> Iterator[str]:
    """``forward_backward_func(forward_step_func=forward_step, ...)``."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _callee(node.func, {}) or ""
        if "forward_backward" not in name:
            continue
        for keyword in node.keywords:
            if keyword.arg == "forward_step_func":
                step = _callee(keyword.value, {})
                if step is not None:
                    yield step


def _named(chosen: frozenset[str], name: str, text: str) -> bool:
    return name in chosen


_IMPORT_FROM = re.compile(r"^[ \t]*from[ \t]+[.\w]+[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)", re.M)
_ALIAS = re.compile(r"(\w+)\s+as\s+(\w+)")


def _import_aliases(source: str) -> dict[str, str]:
    """``from .losses import per_token_terms as terms``: ``terms`` -> ``per_token_terms``.
    Also ``self.kl_penalty`` -> ``TokenKLPenalty.__call__`` for an attribute
    the file sets to a new object (``self.kl_penalty = TokenKLPenalty(...)``):
    calling it calls that object (an ``nn.Module``'s ``forward``), not a
    function of that name elsewhere in the package."""
    aliases = {
        alias.group(2): alias.group(1)
        for statement in _IMPORT_FROM.finditer(source)
        for alias in _ALIAS.finditer(statement.group(1))
    }
    for attribute, cls in _OBJECT_ATTRIBUTE.findall(source):
        aliases[f"self.{attribute}"] = instance_call(aliases.get(cls, cls))
    return aliases


def instance_call(cls: str) -> str:
    """The index's name for calling an object of class ``cls``."""
    return f"{cls}.__call__"


_OBJECT_ATTRIBUTE = re.compile(r"\bself\.(\w+)[ \t]*=[ \t]*([A-Z]\w*)\(")


_DEF_NAME = re.compile(r"^[ \t]*(?:async[ \t]+)?def[ \t]+(\w+)", re.M)
_CLASS_NAME = re.compile(r"^[ \t]*class[ \t]+(\w+)", re.M)
_DEF = re.compile(r"^([ \t]*)(?:async[ \t]+)?def[ \t]+(\w+)[ \t]*\(")


def _detaching_functions(sources: list[tuple[str, str]]) -> frozenset[str]:
    """Functions that detach their first argument (``kl_to_go(log_ratio)``
    starting with ``log_ratio = log_ratio.detach()``): a value passed through
    one is a weight, and the caller, which sees where it goes, judges it.
    By name, as the rest of the index."""
    found: set[str] = set()
    for _, source in sources:
        if ".detach()" not in source:
            continue
        lines = source.splitlines()
        for start, end in _function_blocks(lines):
            header = _SIGNATURE.match("\n".join(lines[start : min(end, start + 12)]))
            if header is None:
                continue
            params = [p.split(":")[0].split("=")[0].strip() for p in header.group(2).split(",")]
            params = [p for p in params if p and p not in ("self", "cls") and not p.startswith("*")]
            body = "\n".join(lines[start + 1 : end])
            if params and re.search(rf"\b{re.escape(params[0])}\.detach\(\)", body):
                found.add(header.group(1))
    return frozenset(found)


_SIGNATURE = re.compile(r"[ \t]*(?:async[ \t]+)?def[ \t]+(\w+)[ \t]*\(([^)]*)\)")


def _function_blocks(lines: list[str]) -> Iterator[tuple[int, int]]:
    """``(first, end)`` line ranges of the outermost ``def`` blocks, from the
    text: a block ends at the first code line indented no deeper than its
    ``def`` (a closing ``) -> T:`` of the signature excepted)."""
    index = 0
    while index < len(lines):
        header = _DEF.match(lines[index])
        if header is None:
            index += 1
            continue
        indent = len(header.group(1))
        end = index + 1
        while end < len(lines):
            line = lines[end]
            stripped = line.lstrip()
            if (
                stripped
                and not stripped.startswith(("#", ")"))
                and len(line) - len(stripped) <= indent
            ):
                break
            end += 1
        yield index, end
        index = end


def _functions(tree: ast.Module) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    """Every function, nested ones included, walking statements only."""
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node
        for name in ("body", "orelse", "finalbody", "handlers"):
            stack.extend(getattr(node, name, ()) or ())


def _own_nodes(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> Iterator[ast.AST]:
    """The nodes of a function's body, not those of functions nested in it,
    nor those of ``torch.no_grad()`` blocks (nothing computed there is
    backpropagated)."""
    stack: list[ast.AST] = list(fn.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.With, ast.AsyncWith)) and any(
            _no_grad(item.context_expr) for item in node.items
        ):
            continue
        yield node
        for child in ast.iter_child_nodes(node):
            if not isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
            ):
                stack.append(child)


def _no_grad(expr: ast.expr) -> bool:
    func = expr.func if isinstance(expr, ast.Call) else expr
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name in ("no_grad", "inference_mode")
