"""How the analysis spells and reads CST nodes: short code for messages and
evidence, the names along an attribute chain, string keys, a node's
descendants. Pure functions over LibCST nodes."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import libcst as cst

from kllint.analysis.module import dotted_name

_EMPTY_MODULE = cst.Module(body=[])


def code(node: cst.CSTNode) -> str:
    """A short spelling of an expression for messages and evidence: names and
    attribute chains in full, calls and subscripts abbreviated. Generating the
    code of every unknown value in full cost more than parsing the file."""
    # By class (LibCST's are final): asked of every value the interpreter
    # makes, and each ``isinstance`` against LibCST's ABCs is a Python call.
    if type(node) is cst.Name or type(node) is cst.Attribute:
        dotted = dotted_name(node)
        if dotted is not None:
            return dotted
    if type(node) is cst.Attribute:
        return f"{code(node.value)}.{node.attr.value}"  # ``model(ids).logits``
    if type(node) is cst.Call:
        return f"{code(node.func)}(...)"
    if type(node) is cst.Subscript:
        key = string_key(node)
        return f"{code(node.value)}[{key!r}]" if key is not None else f"{code(node.value)}[...]"
    if type(node) is cst.Integer or type(node) is cst.Float or type(node) is cst.SimpleString:
        return node.value
    return full_code(node)


def full_code(node: cst.CSTNode) -> str:
    try:
        text = _EMPTY_MODULE.code_for_node(node)
    except Exception:  # pragma: no cover - code generation of a partial node
        return type(node).__name__
    return " ".join(text.split())


def string_key(expr: cst.Subscript) -> str | None:
    """``batch["ref_logprobs"]``: the string key, else None. A TensorDict's
    nested key (``td["teacher", "logps"]``) is its parts joined, so that
    its words name what it holds (``teacher_logps``)."""
    parts = []
    for element in expr.slice:
        inner = element.slice.value if isinstance(element.slice, cst.Index) else None
        value = inner.evaluated_value if isinstance(inner, cst.SimpleString) else None
        if not isinstance(value, str):
            return None
        parts.append(value)
    return "_".join(parts) if parts else None


def int_literal(expr: cst.BaseExpression) -> int | None:
    """``2``, ``-1``: an integer written as a literal, else None."""
    if isinstance(expr, cst.Integer):
        return int(expr.value)
    if (
        isinstance(expr, cst.UnaryOperation)
        and isinstance(expr.operator, cst.Minus)
        and isinstance(expr.expression, cst.Integer)
    ):
        return -int(expr.expression.value)
    return None


def assigned_names(statement: object) -> list[str]:
    """The names and attributes a statement line assigns (``kl_loss = ...``,
    ``self.kl_term: Tensor = ...``, ``total += ...``)."""
    smalls = statement.body if isinstance(statement, cst.SimpleStatementLine) else [statement]
    targets: list[cst.BaseExpression] = []
    for small in smalls:
        if isinstance(small, (cst.AnnAssign, cst.AugAssign)):
            targets.append(small.target)
        elif isinstance(small, cst.Assign):
            targets.extend(t.target for t in small.targets)
    return [
        t.value if isinstance(t, cst.Name) else t.attr.value
        for t in targets
        if isinstance(t, (cst.Name, cst.Attribute))
    ]


def chain_names(expr: cst.BaseExpression) -> list[str]:
    """``self.ref_model(batch["input_ids"])``: ``["self", "ref_model"]``."""
    if isinstance(expr, cst.Name):
        return [expr.value]
    if isinstance(expr, cst.Attribute):
        return [*chain_names(expr.value), expr.attr.value]
    if isinstance(expr, cst.Subscript):
        key = string_key(expr)
        return [*chain_names(expr.value), *([key] if key else [])]
    if isinstance(expr, cst.Call):
        return chain_names(expr.func)
    return []


def named_params(fn: cst.FunctionDef) -> list[cst.Param]:
    """A function's parameters that have names: positional-only, ordinary
    and keyword-only (not ``*args`` or ``**kwargs``)."""
    params = fn.params
    return [*params.posonly_params, *params.params, *params.kwonly_params]


def returned_names(fn: cst.FunctionDef) -> list[str]:
    """The names a function's own ``return`` statements give back, alone or
    in a tuple (``return rewards``, ``return reward, kl.sum(-1)``); not those
    of the functions and classes nested in it."""
    found: list[str] = []
    stack: list[cst.CSTNode] = [fn.body]
    while stack:
        current = stack.pop()
        if isinstance(current, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            continue
        if isinstance(current, cst.Return):
            value = current.value
            items = value.elements if isinstance(value, cst.Tuple) else [value]
            for item in items:
                item_value = item.value if isinstance(item, cst.Element) else item
                if isinstance(item_value, cst.Name):
                    found.append(item_value.value)
            continue
        if isinstance(current, cst.BaseExpression):
            continue  # a return is a statement: no need to look inside expressions
        stack.extend(children(current))
    return found


def descendants(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """The node and every node below it. Read from the nodes' fields:
    LibCST's ``children`` runs a visitor over each node, a tenth of a parse
    for the conditions of a file."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(children(current))


def parents(root: cst.CSTNode) -> dict[int, cst.CSTNode]:
    """The parent of every node below ``root``, by the child's identity. Read
    from the nodes' fields: a LibCST visitor rebuilds every node it passes,
    the cost of a transform of the whole tree."""
    parent: dict[int, cst.CSTNode] = {}
    stack = [root]
    while stack:
        current = stack.pop()
        for child in children(current):
            parent[id(child)] = current
            stack.append(child)
    return parent


def children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """The nodes directly below ``node``, from its fields (LibCST's
    ``children`` runs a visitor)."""
    found: list[cst.CSTNode] = []
    for name in _child_fields(type(node)):
        value = getattr(node, name)
        kind = type(value)
        if kind is list or kind is tuple:
            found.extend(v for v in value if _is_node(type(v)))
        elif _is_node(kind):
            found.append(value)
    return found


def _child_fields(kind: type[cst.CSTNode]) -> tuple[str, ...]:
    known = _FIELDS.get(kind)
    if known is None:
        known = _FIELDS[kind] = tuple(f.name for f in dataclasses.fields(kind))
    return known


_FIELDS: dict[type[cst.CSTNode], tuple[str, ...]] = {}


def _is_node(kind: type) -> bool:
    """``isinstance(value, cst.CSTNode)`` by the value's class, remembered:
    LibCST's classes are ABCs, whose check is a Python call each time."""
    known = _NODE_KINDS.get(kind)
    if known is None:
        known = _NODE_KINDS[kind] = issubclass(kind, cst.CSTNode)
    return known


_NODE_KINDS: dict[type, bool] = {}
