"""Applying plans: LibCST node replacement (the rest of the file, its comments,
formatting, encoding and line endings untouched), Ruff-style edits, diffs, and
atomic writes."""

from __future__ import annotations

import contextlib
import difflib
import os
import stat
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import libcst as cst

from kllint.analysis import syntax
from kllint.fix.plan import Plan

BOM = "\ufeff"

# Parents in which ``a + b`` needs no parentheses: the whole value of a
# statement or of an argument.
_LOOSE_PARENTS = (
    cst.Assign,
    cst.AnnAssign,
    cst.AugAssign,
    cst.Return,
    cst.Arg,
    cst.Element,
    cst.DictElement,
    cst.Expr,
)


@dataclass(frozen=True)
class Edit:
    """Ruff's edit: replace the text between two 1-based (row, column) positions."""

    content: str
    row: int
    column: int
    end_row: int
    end_column: int

    def to_dict(self) -> dict[str, object]:
        return {
            "content": self.content,
            "location": {"row": self.row, "column": self.column},
            "end_location": {"row": self.end_row, "column": self.end_column},
        }


class _Replace(cst.CSTTransformer):
    """Replaces nodes by identity, descending only along the paths to them:
    a transformer rebuilds every node it enters, and a rewrite touches a
    few expressions of a long file."""

    def __init__(self, replacements: dict[int, cst.CSTNode], on_path: set[int]) -> None:
        self.replacements = replacements
        self.on_path = on_path

    def on_visit(self, node: cst.CSTNode) -> bool:
        return id(node) in self.on_path

    def on_leave(self, original_node: Any, updated_node: Any) -> Any:
        return self.replacements.get(id(original_node), updated_node)


def rewrite(
    module: cst.Module,
    plans: Sequence[Plan],
    parent_of: Mapping[int, cst.CSTNode] | None = None,
) -> str:
    """The module's text with every plan applied (one pass; a plan nested in
    another's node is superseded by the outer one). ``parent_of``: the
    module's parents by identity, where the caller has them."""
    if not plans:
        return module.code
    if parent_of is None:
        parent_of = syntax.parents(module)
    on_path: set[int] = {id(module)}
    replacements: dict[int, cst.CSTNode] = {}
    for p in plans:
        above = parent_of.get(id(p.node))
        while above is not None and id(above) not in on_path:
            on_path.add(id(above))
            above = parent_of.get(id(above))
        replacement = p.replacement
        parent = parent_of.get(id(p.node))
        if isinstance(replacement, cst.BaseExpression) and not replacement.lpar:
            if not isinstance(parent, _LOOSE_PARENTS):
                replacement = replacement.with_changes(
                    lpar=[cst.LeftParen()], rpar=[cst.RightParen()]
                )
        replacements[id(p.node)] = replacement
    return module.visit(_Replace(replacements, on_path)).code


def edit(old: str, new: str) -> Edit:
    """The one edit that turns ``old`` into ``new``: the differing middle."""
    start = 0
    limit = min(len(old), len(new))
    while start < limit and old[start] == new[start]:
        start += 1
    end_old, end_new = len(old), len(new)
    while end_old > start and end_new > start and old[end_old - 1] == new[end_new - 1]:
        end_old -= 1
        end_new -= 1
    row, column = _position(old, start)
    end_row, end_column = _position(old, end_old)
    return Edit(new[start:end_new], row, column, end_row, end_column)


def _position(text: str, offset: int) -> tuple[int, int]:
    before = text[:offset]
    row = before.count("\n") + 1
    return row, offset - (before.rfind("\n") + 1) + 1


Span = tuple[tuple[int, int], tuple[int, int]]


def new_span(e: Edit, replaced: Span) -> Span:
    """Where the replaced node (``replaced``, 1-based, in the old text) lies in
    the edited text: the edit sits inside it, so its start stays and its end
    moves by what the edit adds."""
    start, (end_row, end_column) = replaced
    lines = e.content.split("\n")
    if e.end_row != end_row:  # the node's last line is after the edit's: rows shift only
        return start, (end_row + len(lines) - 1 - (e.end_row - e.row), end_column)
    tail = end_column - e.end_column  # characters of the node after the edit
    if len(lines) == 1:
        return start, (e.row, e.column + len(e.content) + tail)
    return start, (e.row + len(lines) - 1, len(lines[-1]) + 1 + tail)


def unified_diff(path: str, old: str, new: str) -> str:
    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True),
            new.splitlines(keepends=True),
            fromfile=f"a/{path}",
            tofile=f"b/{path}",
        )
    )


def encode(text: str, original: bytes) -> bytes:
    """The text in the file's own encoding: UTF-8, with its BOM if it had one
    (line endings are the module's own: LibCST keeps them)."""
    data = text.encode("utf-8")
    if original.startswith(BOM.encode("utf-8")) and not text.startswith(BOM):
        data = BOM.encode("utf-8") + data
    return data


def write_atomic(path: Path, data: bytes) -> None:
    """Write through a temporary file in the same folder and ``os.replace``:
    a reader (or an interrupted run) sees the old file or the new one, never
    half of one. The file's permission bits are kept."""
    mode = stat.S_IMODE(path.stat().st_mode)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".kllint-tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
