"""The fixture corpus analysed once per test run. Several tests read every
finding of every fixture (their annotations, their headlines, their
confirmation by the harness), and the analysis is the slow part."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from kllint.analysis.project import Project
from kllint.analysis.roles import RolePatterns
from kllint.driver import check_source
from kllint.findings import Finding


@cache
def findings_of(path: Path) -> list[Finding]:
    """What kllint reports on one fixture, analysed with its folder as the project."""
    return check_source(path.read_text(), str(path), _project(path.parent), RolePatterns())


@cache
def _project(folder: Path) -> Project:
    """One project per folder, as a run over the folder has: what it scans
    once (callers, defaults, helper modules) serves each of its files."""
    return Project([folder])
