"""What several formats share: file errors as entries, paths from the repository root."""

from __future__ import annotations

import dataclasses
import enum
import os
import re
from pathlib import Path
from typing import Any

from kllint.analysis import ir
from kllint.engine import LintResult
from kllint.findings import FileError, Finding

FILE_ERROR_CODE = "E999"
FILE_ERROR_NAME = "file-error"
_LINE_END = re.compile(r"\r\n|\r|\n")


def entries(result: LintResult) -> list[Finding | FileError]:
    """Findings and file errors in one list, by path, line, column, code."""

    def key(entry: Finding | FileError) -> tuple[str, int, int, str]:
        if isinstance(entry, Finding):
            return entry.sort_key()
        return (entry.path, entry.line, entry.column, entry.code)

    return sorted([*result.findings, *result.errors], key=key)


def source_line(result: LintResult, path: str, line: int) -> str | None:
    source = result.sources.get(path)
    if source is None:
        return None
    # Only \n, \r\n and \r end a line of Python; str.splitlines() also
    # splits at a form feed, \x85 or U+2028 and would show the wrong line.
    lines = _LINE_END.split(source)
    return lines[line - 1] if 0 < line <= len(lines) else None


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
