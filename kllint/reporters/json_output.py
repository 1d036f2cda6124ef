"""``--format json``: one array of findings and file errors, by path, line, column.

Each finding is ``{code, name, path, cell, line, column, end_line,
end_column, severity, message, notes, fix_title, facts, fix}`` plus
``confirmation`` after ``--confirm``; a file error has the same keys with
code ``E999`` (or ``E998``). Lines and columns are 1-based; ``end_column`` is exclusive.
``cell`` is ``null`` outside notebooks; in one, the 1-based cell number,
and lines count from the cell's first line."""

from __future__ import annotations

import json
from typing import Any

from kllint.findings import FileError, Finding, LintResult
from kllint.reporters.common import FILE_ERROR_NAME, entries, jsonable


def render(result: LintResult) -> str:
    return json.dumps([_entry(e) for e in entries(result)], indent=2, default=jsonable) + "\n"


def _entry(entry: Finding | FileError) -> dict[str, Any]:
    if isinstance(entry, FileError):
        return {
            "code": entry.code,
            "name": "could-not-analyse" if entry.code == "E998" else FILE_ERROR_NAME,
            "path": entry.path,
            "cell": entry.cell,
            "line": entry.line,
            "column": entry.column,
            "end_line": entry.line,
            "end_column": entry.column,
            "severity": "error",
            "message": entry.message,
            "notes": [],
            "fix_title": None,
            "facts": {},
            "fix": None,
        }
    data = {
        "code": entry.code,
        "name": entry.name,
        "path": entry.path,
        "cell": entry.cell,
        "line": entry.line,
        "column": entry.column,
        "end_line": entry.end_line,
        "end_column": entry.end_column,
        "severity": entry.severity,
        "message": entry.message,
        "notes": entry.notes,
        "fix_title": entry.fix_title,
        "facts": entry.facts,
        "fix": _fix(entry),
    }
    if entry.confirmation is not None:
        data["confirmation"] = entry.confirmation
    return data


def _fix(entry: Finding) -> dict[str, Any] | None:
    """Ruff's shape; ``confirmation`` (the harness on the rewrite) only with --confirm."""
    if entry.fix is None:
        return None
    if entry.confirmation is None:
        return {k: v for k, v in entry.fix.items() if k != "confirmation"}
    return entry.fix
