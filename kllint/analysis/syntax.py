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
    if isinstance(node, (cst.Name, cst.Attribute)):
        dotted = dotted_name(node)
        if dotted is not None:
            return dotted
    if isinstance(node, cst.Attribute):
        return f"{code(node.value)}.{node.attr.value}"  # ``model(ids).logits``
    if isinstance(node, cst.Call):
        return f"{code(node.func)}(...)"
    if isinstance(node, cst.Subscript):
        key = string_key(node)
        return f"{code(node.value)}[{key!r}]" if key is not None else f"{code(node.value)}[...]"
    if isinstance(node, (cst.Integer, cst.Float, cst.SimpleString)):
        return node.value
    return full_code(node)


def full_code(node: cst.CSTNode) -> str:
    try:
        text = _EMPTY_MODULE.code_for_node(node)
    except Exception:  # pragma: no cover - code generation of a partial node
        return type(node).__name__
    return " ".join(text.split())


def string_key(expr: cst.Subscript) -> str | None:
    """``batch["ref_logprobs"]``: the string key, else None."""
    if len(expr.slice) == 1 and isinstance(expr.slice[0].slice, cst.Index):
        inner = expr.slice[0].slice.value
        if isinstance(inner, cst.SimpleString):
            value = inner.evaluated_value
            return value if isinstance(value, str) else None
    return None


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


def descendants(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """The node and every node below it. Read from the nodes' fields:
    LibCST's ``children`` runs a visitor over each node, a tenth of a parse
    for the conditions of a file."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        for name in _child_fields(type(current)):
            value = getattr(current, name)
            if isinstance(value, cst.CSTNode):
                stack.append(value)
            elif isinstance(value, (list, tuple)):
                stack.extend(v for v in value if isinstance(v, cst.CSTNode))


def _child_fields(kind: type[cst.CSTNode]) -> tuple[str, ...]:
    known = _FIELDS.get(kind)
    if known is None:
        known = _FIELDS[kind] = tuple(f.name for f in dataclasses.fields(kind))
    return known


_FIELDS: dict[type[cst.CSTNode], tuple[str, ...]] = {}
