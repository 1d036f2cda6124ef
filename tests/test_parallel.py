"""Worker processes change the speed of a run, never its findings."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kllint import engine
from kllint.config import load_settings

FIXTURES = Path(__file__).parent / "fixtures"


def test_parallel_run_reports_what_a_serial_run_reports(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A sample of the corpus, a few hundred files in a project of their own:
    # the property is the engine's (how files are shared out and findings
    # gathered), and the whole corpus, linted twice, was a seven-minute test.
    # Every folder that is not a held-out set, and every tenth held-out set.
    corpus = tmp_path / "fixtures"
    for folder in sorted(FIXTURES.iterdir()):
        number = folder.name.removeprefix("heldout")
        if folder.is_dir() and (not number.isdigit() or int(number) % 10 == 0):
            shutil.copytree(folder, corpus / folder.name)
    monkeypatch.setattr(engine, "PARALLEL_MIN_BYTES", 1)
    settings = load_settings([corpus])
    serial = engine.lint_paths([corpus], settings, keep_sites=True)
    parallel = engine.lint_paths([corpus], settings, jobs=2)

    def key(result: engine.LintResult) -> list[tuple[str, int, int, str]]:
        return [(f.path, f.line, f.column, f.code) for f in result.findings]

    assert serial.findings, "the corpus has findings"
    assert key(parallel) == key(serial)
    assert parallel.files_checked == serial.files_checked
    assert all(f.site is None for f in parallel.findings)  # IR stays in the worker
    assert all(f.site is not None for f in serial.findings)  # kept for --confirm


def test_workers_follow_the_work_not_the_file_count(monkeypatch: pytest.MonkeyPatch) -> None:
    from kllint import workers

    monkeypatch.setattr(workers, "usable_cpus", lambda: 8)
    assert engine.worker_count(100 << 10, None) == 1  # 100 KB to analyse: one worker
    assert engine.worker_count(2 * engine.PARALLEL_MIN_BYTES, None) == 2
    assert engine.worker_count(1 << 30, None) == 8
    assert engine.worker_count(1 << 30, 3) == 3  # --jobs caps it


def test_a_cgroup_quota_caps_the_workers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from kllint import workers

    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("150000 100000\n")  # 1.5 CPUs: two workers at most
    real_open = open

    def fake_open(path: object, *args: object, **kwargs: object) -> object:
        if path == "/sys/fs/cgroup/cpu.max":
            path = cpu_max
        return real_open(path, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr("builtins.open", fake_open)
    monkeypatch.setattr(workers.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert workers.usable_cpus() == 2
