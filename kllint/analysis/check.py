"""Entry point of the analysis for one file (stub until the analysis lands)."""

from __future__ import annotations

from kllint.analysis.project import Project
from kllint.analysis.roles import RolePatterns
from kllint.findings import Finding


def check_source(source: str, path: str, project: Project, roles: RolePatterns) -> list[Finding]:
    """All findings of every rule in one file. Raises ``libcst.ParserSyntaxError``
    when the file does not parse. ``path`` is the path as displayed."""
    return []
