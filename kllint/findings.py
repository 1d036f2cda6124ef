"""What a lint run reports: findings, files that could not be checked, and
the result of a run as reporters see it (no engine import needed)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kllint.analysis.sites import KLSite


@dataclass
class Finding:
    code: str  # "KL002"
    name: str  # "differentiated-k3-estimate"
    path: str  # as the user gave it (relative when under the working directory)
    line: int  # 1-based
    column: int  # 1-based
    end_line: int
    end_column: int
    message: str  # one line: what is wrong, in the code's own names
    severity: str = "error"  # "error" | "warning"
    fix_title: str | None = None
    # The reasoning behind the one-line message: the resolved selector, the
    # helper chain, what the gradient is. Shown indented under the finding.
    notes: list[str] = field(default_factory=list)
    # The facts behind the message, for json/sarif consumers:
    # estimator, policy, reference, sink, level, branch, gradient, ...
    facts: dict[str, Any] = field(default_factory=dict)
    # The KL site the finding is about (IR term and where it flows); the
    # harness confirms findings from it. Not serialised.
    site: KLSite | None = field(default=None, repr=False, compare=False)
    # The same finding's KL sites on the other branches that reach it
    # (``if mask is None`` in a helper), each confirmed. Not serialised.
    alternatives: list[KLSite] = field(default_factory=list, repr=False, compare=False)
    # Filled by --confirm: {"verdict": ..., ...}
    confirmation: dict[str, Any] | None = None
    # In a notebook: the 1-based number of the cell (markdown cells count),
    # and ``line`` counts from the cell's first line.
    cell: int | None = None
    # Filled by the fixer (kllint.fix): Ruff's fix shape {"applicability",
    # "message", "edits": [...]}, or None when no verified fix exists.
    fix: dict[str, Any] | None = None

    def sort_key(self) -> tuple[str, int, int, int, str]:
        return (self.path, self.cell or 0, self.line, self.column, self.code)


@dataclass
class FileError:
    """A file that could not be linted (syntax error, unreadable, over a budget)."""

    path: str
    line: int
    column: int
    message: str
    cell: int | None = None  # in a notebook, as in ``Finding``
    # E999: not Python (a syntax error, not decodable, unreadable); E998: kllint
    # could not analyse it (too large, too slow, out of memory, a crash).
    code: str = "E999"


@dataclass
class LintResult:
    findings: list[Finding]
    errors: list[FileError]  # files that could not be checked: syntax, encoding, a crash
    files_checked: int
    internal_errors: int = 0  # how many of ``errors`` are kllint crashing, not bad input
    # The text of each file with findings, by displayed path: reporters show
    # the offending line and fingerprint it.
    sources: dict[str, str] = field(default_factory=dict, repr=False)
    # Not findings: stale suppression comments (see kllint.suppression).
    warnings: list[FileError] = field(default_factory=list)
