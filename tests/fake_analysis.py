"""A stand-in for ``check_source`` while the analysis is being written: it
parses like the real one (so syntax errors surface) and flags a call by its
name. The tests of the shell (config, suppression, reporters, CLI) need
findings, not correct ones."""

from __future__ import annotations

from typing import Any

import libcst

from kllint.findings import Finding
from kllint.rules import RULES

# call -> the rule it stands for
MARKERS = {
    "k1_loss(": "KL001",
    "low_var_kl(": "KL002",
    "kl_no_grad(": "KL005",
}


def finding(
    code: str, path: str = "train.py", line: int = 1, column: int = 1, span: int = 1, **kw: Any
) -> Finding:
    """A finding of rule ``code`` spanning ``span`` characters of one line."""
    fields: dict[str, Any] = {
        "end_line": line,
        "end_column": column + span,
        "message": f"{RULES[code].name} here",
        "severity": RULES[code].severity,
    }
    fields.update(kw)
    return Finding(code, RULES[code].name, path, line, column, **fields)


def flag_markers(source: str, path: str, project: object, roles: object) -> list[Finding]:
    libcst.parse_module(source)  # raises ParserSyntaxError like the real analysis
    found = []
    for number, text in enumerate(source.splitlines(), start=1):
        for marker, code in MARKERS.items():
            column = text.find(marker)
            if column >= 0:
                call_end = text.find(")", column) + 1 or len(text)
                found.append(
                    finding(
                        code,
                        path,
                        number,
                        column + 1,
                        span=call_end - column,
                        fix_title="Use the k2 estimate",
                    )
                )
    return found
