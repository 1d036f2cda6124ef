"""The human formats: ``full`` (the default, with the offending line) and ``concise``."""

from __future__ import annotations

from collections import Counter
from typing import Any

import click

from kllint.findings import FileError, Finding, LintResult
from kllint.reporters.common import entries, location, source_line


def render_full(result: LintResult, *, color: bool = False) -> str:
    blocks = []
    for entry in entries(result):
        if isinstance(entry, FileError):
            blocks.append(_file_error(entry, color) + "\n")
            continue
        lines = [_headline(entry, color)]
        text = source_line(result, entry.path, entry.line, entry.cell)
        if text is not None:
            lines += _snippet(entry, text, color)
        lines += [f"  = {_style('note', color, bold=True)}: {note}" for note in entry.notes]
        if entry.fix_title:
            lines.append(f"  = {_style('help', color, bold=True)}: {entry.fix_title}")
        if entry.confirmation is not None:
            lines.append(f"  = {_style('confirmation', color, bold=True)}: {_confirmation(entry)}")
        blocks.append("\n".join(lines) + "\n")
    return "\n".join([*blocks, summary(result)]) + "\n"


def render_concise(result: LintResult, *, color: bool = False) -> str:
    lines = [
        _file_error(e, color) if isinstance(e, FileError) else _headline(e, color)
        for e in entries(result)
    ]
    return "\n".join([*lines, summary(result)]) + "\n"


def summary(result: LintResult) -> str:
    parts = []
    if result.findings:
        counts = Counter(f.code for f in result.findings)
        by_code = ", ".join(f"{code}: {n}" for code, n in sorted(counts.items()))
        parts.append(f"Found {_plural(len(result.findings), 'finding')} ({by_code}).")
    if result.errors:
        parts.append(f"{_plural(len(result.errors), 'file')} could not be checked.")
    return " ".join(parts) or "All checks passed!"


def statistics(result: LintResult) -> str:
    """``--statistics``: how many findings of each rule, most frequent first (as Ruff)."""
    counts = Counter((f.code, f.name) for f in result.findings)
    for error in result.errors:
        counts[(error.code, "could-not-analyse" if error.code == "E998" else "file-error")] += 1
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    width = max((len(str(n)) for n in counts.values()), default=1)
    lines = [f"{n:>{width}}  {code}  {name}" for (code, name), n in ranked]
    return "".join(f"{line}\n" for line in lines)


def _headline(f: Finding, color: bool) -> str:
    where = _style(f"{location(f)}:", color, bold=True)
    code = _style(f.code, color, fg="red" if f.severity == "error" else "yellow", bold=True)
    return f"{where} {code} [{f.name}] {f.message}"


def _file_error(e: FileError, color: bool) -> str:
    where = _style(f"{location(e)}:", color, bold=True)
    return f"{where} {_style(e.code, color, fg='red', bold=True)} {e.message}"


def _snippet(f: Finding, text: str, color: bool) -> list[str]:
    start = min(f.column - 1, len(text))
    end = f.end_column - 1 if f.end_line == f.line else len(text)
    # Keep the line's tabs in the margin so the carets line up however tabs render.
    margin = "".join(c if c == "\t" else " " for c in text[:start])
    carets = _style("^" * max(1, end - start), color, fg="red", bold=True)
    number = str(f.line)
    gutter = " " * len(number)
    return [f"{gutter} |", f"{number} | {text}", f"{gutter} | {margin}{carets}", f"{gutter} |"]


def _confirmation(f: Finding) -> str:
    # The harness's record is long (per instance, per seed): json has all of it.
    details = f.confirmation or {}
    return str(details.get("summary") or details.get("verdict") or "")


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _style(text: str, color: bool, **styles: Any) -> str:
    return click.style(text, **styles) if color else text
