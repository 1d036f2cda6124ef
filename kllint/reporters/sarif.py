"""``--format sarif``: SARIF 2.1.0 as GitHub code scanning reads it.

Paths are relative to the repository root (``uriBaseId`` ``%SRCROOT%``).
Columns are converted to UTF-16 code units, SARIF's default ``columnKind``.
``primaryLocationLineHash`` hashes the rule, the file and the flagged line's
text (whitespace collapsed), not its number, so an alert survives edits
above it; ``:n`` numbers identical lines in one file."""

from __future__ import annotations

import hashlib
import json
import os
import urllib.parse
from collections import Counter
from pathlib import Path
from typing import Any

from kllint import __version__
from kllint.findings import FileError, Finding, LintResult
from kllint.reporters.common import (
    file_lines,
    jsonable,
    repo_relative,
    repo_root,
    source_line,
)
from kllint.rulebook import find_rule_page, parse_sections
from kllint.rules import RULES, RuleInfo

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
INFORMATION_URI = "https://pypi.org/project/kllint/"


def render(result: LintResult) -> str:
    root = repo_root()
    seen: Counter[str] = Counter()
    run = {
        "tool": {
            "driver": {
                "name": "kllint",
                "version": __version__,
                "semanticVersion": __version__,
                "informationUri": INFORMATION_URI,
                "rules": [_rule(rule) for rule in RULES.values()],
            }
        },
        "columnKind": "utf16CodeUnits",
        "results": [
            _result(f, result, root, seen) for f in sorted(result.findings, key=Finding.sort_key)
        ],
        "invocations": [
            {
                "executionSuccessful": result.internal_errors == 0,
                "toolExecutionNotifications": [_notification(e, root) for e in result.errors],
            }
        ],
    }
    log = {"$schema": SCHEMA, "version": "2.1.0", "runs": [run]}
    return json.dumps(log, indent=2, default=jsonable) + "\n"


def _rule(rule: RuleInfo) -> dict[str, Any]:
    page = find_rule_page(rule.code)
    what = parse_sections(page).get("What it does") if page else None
    return {
        "id": rule.code,
        "name": rule.name,
        "shortDescription": {"text": rule.summary},
        "fullDescription": {"text": what or rule.summary},
        "help": {"text": page or rule.summary, "markdown": page or rule.summary},
        "defaultConfiguration": {"level": _level(rule.severity)},
        "properties": {"tags": ["correctness", "kl-divergence"]},
    }


def _result(f: Finding, result: LintResult, root: Path, seen: Counter[str]) -> dict[str, Any]:
    uri = _uri(repo_relative(f.path, root))
    text = source_line(result, f.path, f.line, f.cell) or ""
    end_text = source_line(result, f.path, f.end_line, f.cell) or ""
    start = (f.line, _utf16_column(text, f.column))
    end = max((f.end_line, _utf16_column(end_text, f.end_column)), start)
    cell = f"\0cell {f.cell}" if f.cell is not None else ""
    line_hash = hashlib.sha256(
        f"{f.code}\0{uri}{cell}\0{' '.join(text.split())}".encode()
    ).hexdigest()
    seen[line_hash] += 1
    properties: dict[str, Any] = {"name": f.name, "facts": f.facts}
    if f.notes:
        properties["notes"] = f.notes
    if f.fix_title:
        properties["fix_title"] = f.fix_title
    if f.confirmation is not None:
        properties["confirmation"] = f.confirmation
    if f.cell is not None:
        # SARIF regions count lines of the file; a notebook's are JSON lines,
        # so the region is the cell's line and the cell is named here.
        properties["cell"] = f.cell
    message = "\n".join(
        [
            f"{f.message} (cell {f.cell})" if f.cell is not None else f.message,
            *(f"Note: {note}" for note in f.notes),
            *([f"Help: {f.fix_title}"] if f.fix_title else []),
        ]
    )
    return {
        "ruleId": f.code,
        **({"ruleIndex": list(RULES).index(f.code)} if f.code in RULES else {}),
        "level": _level(f.severity),
        "message": {"text": message},
        "locations": [_notebook_location(f, uri) or _location(uri, start, end)],
        "partialFingerprints": {"primaryLocationLineHash": f"{line_hash[:16]}:{seen[line_hash]}"},
        "properties": properties,
        **({"fixes": [_fix(f, uri, result)]} if f.fix is not None else {}),
    }


def _fix(f: Finding, uri: str, result: LintResult) -> dict[str, Any]:
    """A SARIF fix: the finding's edits as replacements of its artifact
    (1-based lines; columns in UTF-16 code units, end exclusive)."""
    assert f.fix is not None
    replacements = []
    for e in f.fix["edits"]:
        start, end = e["location"], e["end_location"]
        first = source_line(result, f.path, start["row"]) or ""
        last = source_line(result, f.path, end["row"]) or ""
        replacements.append(
            {
                "deletedRegion": {
                    "startLine": start["row"],
                    "startColumn": _utf16_column(first, start["column"]),
                    "endLine": end["row"],
                    "endColumn": _utf16_column(last, end["column"]),
                },
                "insertedContent": {"text": e["content"]},
            }
        )
    return {
        "description": {"text": f.fix["message"]},
        "artifactChanges": [{"artifactLocation": {"uri": uri}, "replacements": replacements}],
    }


def _notification(e: FileError, root: Path) -> dict[str, Any]:
    where = (e.line, max(1, e.column))
    return {
        "level": "error",
        "message": {"text": e.message},
        "descriptor": {"id": e.code},
        "locations": [_location(_uri(repo_relative(e.path, root)), where, where)],
    }


def _uri(path: str) -> str:
    """A relative URI reference: percent-encoded (RFC 3986), from the file
    name's bytes, so a name that is not UTF-8 (surrogate escapes) is kept too."""
    return urllib.parse.quote(os.fsencode(path), safe="/")


def _location(uri: str, start: tuple[int, int], end: tuple[int, int]) -> dict[str, Any]:
    region = {
        "startLine": start[0],
        "startColumn": start[1],
        "endLine": end[0],
        "endColumn": end[1],
    }
    return {
        "physicalLocation": {
            "artifactLocation": {"uri": uri, "uriBaseId": "%SRCROOT%"},
            "region": region,
        }
    }


def _notebook_location(f: Finding, uri: str) -> dict[str, Any] | None:
    """In a notebook, the file's own lines that hold the cell's (columns are
    shifted by JSON quoting there, so the region is whole lines)."""
    mapped = file_lines(f) if f.cell is not None else None
    if mapped is None:
        return None
    location = _location(uri, (mapped[0], 1), (mapped[1], 1))
    region = location["physicalLocation"]["region"]
    del region["startColumn"], region["endColumn"]
    return location


def _utf16_column(text: str, column: int) -> int:
    """A 1-based code-point column as a 1-based UTF-16 column: an astral
    character (an emoji in a comment) counts twice."""
    prefix = text[: column - 1]
    return len(prefix.encode("utf-16-le")) // 2 + (column - 1 - len(prefix)) + 1


def _level(severity: str) -> str:
    return "warning" if severity == "warning" else "error"
