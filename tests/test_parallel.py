"""Worker processes change the speed of a run, never its findings."""

from __future__ import annotations

from pathlib import Path

import pytest

from kllint import engine
from kllint.config import load_settings

CORPUS = Path(__file__).parent / "fixtures"


def test_parallel_run_reports_what_a_serial_run_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine, "PARALLEL_MIN_FILES", 2)
    settings = load_settings([CORPUS])
    serial = engine.lint_paths([CORPUS], settings, keep_sites=True)
    parallel = engine.lint_paths([CORPUS], settings, jobs=2)

    def key(result: engine.LintResult) -> list[tuple[str, int, int, str]]:
        return [(f.path, f.line, f.column, f.code) for f in result.findings]

    assert serial.findings, "the corpus has findings"
    assert key(parallel) == key(serial)
    assert parallel.files_checked == serial.files_checked
    assert all(f.site is None for f in parallel.findings)  # IR stays in the worker
    assert all(f.site is not None for f in serial.findings)  # kept for --confirm
