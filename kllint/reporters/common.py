"""What several formats share: file errors as entries, paths from the repository root."""

from __future__ import annotations

import dataclasses
import enum
import os
import re
from pathlib import Path
from typing import Any

from kllint import notebook
from kllint.analysis import ir
from kllint.findings import FileError, Finding, LintResult
from kllint.notebook import cell_key

FILE_ERROR_CODE = "E999"
FILE_ERROR_NAME = "file-error"
_LINE_END = re.compile(r"\r\n|\r|\n")


def entries(result: LintResult) -> list[Finding | FileError]:
    """Findings and file errors in one list, by path, line, column, code."""

    def key(entry: Finding | FileError) -> tuple[str, int, int, int, str]:
        if isinstance(entry, Finding):
            return entry.sort_key()
        return (entry.path, entry.cell or 0, entry.line, entry.column, entry.code)

    return sorted([*result.findings, *result.errors], key=key)


def source_line(result: LintResult, path: str, line: int, cell: int | None = None) -> str | None:
    source = result.sources.get(path if cell is None else cell_key(path, cell))
    if source is None:
        return None
    # Only \n, \r\n and \r end a line of Python; str.splitlines() also
    # splits at a form feed, \x85 or U+2028 and would show the wrong line.
    lines = _LINE_END.split(source)
    return lines[line - 1] if 0 < line <= len(lines) else None


def location(entry: Finding | FileError) -> str:
    """``path:line:column``, or ``path:cell N:line:column`` in a notebook (as Ruff)."""
    cell = f"cell {entry.cell}:" if entry.cell is not None else ""
    return f"{entry.path}:{cell}{entry.line}:{entry.column}"


def file_lines(entry: Finding | FileError) -> tuple[int, int] | None:
    """``(line, end_line)`` in the notebook file itself for an entry in a cell
    (see ``notebook.file_line``), else ``None``."""
    if entry.cell is None:
        return None
    try:
        text = Path(entry.path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    end = entry.end_line if isinstance(entry, Finding) else entry.line
    start_line = notebook.file_line(text, entry.cell, entry.line)
    end_line = notebook.file_line(text, entry.cell, end)
    return (start_line, end_line) if start_line and end_line else None


def repo_root() -> Path:
    """The enclosing git work tree of the working directory, else the working directory."""
    cwd = Path.cwd()
    return next((d for d in (cwd, *cwd.parents) if (d / ".git").exists()), cwd)


def repo_relative(path: str, root: Path) -> str:
    """``path`` (as displayed) relative to ``root`` with forward slashes, as
    GitHub matches annotations and alerts to files by it."""
    try:
        return Path(os.path.abspath(path)).relative_to(root).as_posix()
    except ValueError:
        return Path(path).as_posix()


def jsonable(value: Any) -> Any:
    """``json.dumps(default=...)`` for the values a finding's facts may hold."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, ir.Node):
        return ir.render(value)
    if isinstance(value, Path):
        return value.as_posix()
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=str)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return str(value)
