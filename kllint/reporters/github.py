"""``--format github``: workflow commands that GitHub Actions turns into
annotations on the pull request's diff."""

from __future__ import annotations

from kllint.engine import LintResult
from kllint.findings import FileError
from kllint.reporters.common import entries, repo_relative, repo_root


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
            if e.fix_title:
                message += f"\nhelp: {e.fix_title}"
            end_line, end_column = e.end_line, e.end_column
        properties = {
            "file": repo_relative(e.path, root),
            "line": e.line,
            "col": e.column,
            "endLine": end_line,
            "endColumn": end_column,
            "title": f"kllint ({code})",
        }
        props = ",".join(f"{k}={escape_property(str(v))}" for k, v in properties.items())
        lines.append(f"::{level} {props}::{escape_data(message)}")
    return "".join(f"{line}\n" for line in lines)


def escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")
