"""A few seconds of fuzzing on every run: generated programs and mutated
fixtures never crash, hang or silence kllint. ``scripts/fuzz.py`` runs the
same at a larger size."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "fuzz", Path(__file__).parent.parent / "scripts" / "fuzz.py"
)
assert _spec is not None and _spec.loader is not None
fuzz = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fuzz)


def test_mutated_fixtures(tmp_path: Path) -> None:
    assert fuzz.run(fuzz.mutants(60, seed=1), tmp_path) == []


def test_generated_programs(tmp_path: Path) -> None:
    pytest.importorskip("hypothesmith")
    assert fuzz.run(fuzz.programs(20, seed=1), tmp_path) == []
