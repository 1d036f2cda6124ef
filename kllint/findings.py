"""What a rule reports."""

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
    message: str
    severity: str = "error"  # "error" | "warning"
    fix_title: str | None = None
    # The facts behind the message, for json/sarif consumers:
    # estimator, policy, reference, sink, level, branch, gradient, ...
    facts: dict[str, Any] = field(default_factory=dict)
    # The KL site the finding is about (IR term and where it flows); the
    # harness confirms findings from it. Not serialised.
    site: KLSite | None = field(default=None, repr=False, compare=False)
    # Filled by --confirm: {"verdict": ..., ...}
    confirmation: dict[str, Any] | None = None
    # Filled by the fixer (kllint.fix): Ruff's fix shape {"applicability",
    # "message", "edits": [...]}, or None when no verified fix exists.
    fix: dict[str, Any] | None = None

    def sort_key(self) -> tuple[str, int, int, str]:
        return (self.path, self.line, self.column, self.code)


@dataclass
class FileError:
    """A file that could not be linted (syntax error, unreadable)."""

    path: str
    line: int
    column: int
    message: str
