"""``--format github``: workflow commands that GitHub Actions turns into
annotations on the pull request's diff."""

from __future__ import annotations

from kllint.findings import FileError, LintResult
from kllint.reporters.common import (
    entries,
    file_lines,
    repo_relative,
    repo_root,
)


def render(result: LintResult) -> str:
    root = repo_root()
    lines = []
    for e in entries(result):
        if isinstance(e, FileError):
            level, code, message = "error", e.code, e.message
            end_line, end_column = e.line, e.column
        else:
            level = "warning" if e.severity == "warning" else "error"
            code, message = e.code, e.message
            message += "".join(f"\nnote: {note}" for note in e.notes)
            if e.fix_title:
                message += f"\nhelp: {e.fix_title}"
            end_line, end_column = e.end_line, e.end_column
        properties: dict[str, object] = {
            "file": repo_relative(e.path, root),
            "line": e.line,
            "col": e.column,
            "endLine": end_line,
            "endColumn": end_column,
            "title": f"kllint ({code})",
        }
        if e.cell is not None:
            # The diff shows a notebook's JSON: mark the file's lines that hold
            # the cell's lines (columns there are shifted by quoting, so none).
            message = f"cell {e.cell}, line {e.line}: {message}"
            properties["title"] = f"kllint ({code}) cell {e.cell}"
            del properties["col"], properties["endColumn"]
            mapped = file_lines(e)
            if mapped is not None:
                properties["line"], properties["endLine"] = mapped
        props = ",".join(f"{k}={escape_property(str(v))}" for k, v in properties.items())
        lines.append(f"::{level} {props}::{escape_data(message)}")
    return "".join(f"{line}\n" for line in lines)


def escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")
