"""Role names are configurable: ``[tool.kllint.roles]`` adds patterns to the
built-in evidence, so a project's own spelling of the reference is seen."""

from __future__ import annotations

from pathlib import Path

from kllint.config import load_settings
from kllint.engine import lint_paths

TRAINER = """\
import torch


def training_step(policy_logp, golden_logp, mask):
    kl = policy_logp - golden_logp
    loss = (kl * mask).sum(-1).mean()
    loss.backward()
"""


def lint(tmp_path: Path, config: str) -> list[tuple[int, str]]:
    (tmp_path / "pyproject.toml").write_text(config)
    (tmp_path / "train.py").write_text(TRAINER)
    result = lint_paths([tmp_path], load_settings([tmp_path]), jobs=1)
    return [(f.line, f.code) for f in result.findings]


def test_an_unknown_spelling_of_the_reference_is_not_guessed(tmp_path: Path) -> None:
    # "golden_logp" is a log-prob with no reference evidence: both operands
    # look like the policy, so there is no KL to judge.
    assert lint(tmp_path, "[tool.kllint]\n") == []


def test_a_configured_reference_pattern_makes_it_the_reference(tmp_path: Path) -> None:
    config = '[tool.kllint]\n[tool.kllint.roles]\nreference = ["^golden_"]\n'
    assert lint(tmp_path, config) == [(5, "KL001")]
