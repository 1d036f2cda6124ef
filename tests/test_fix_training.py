"""Before and after ``kllint --fix``, trained: the same three buggy GRPO-style
losses (k1, k3 and a token-level k2 penalty) and what ``--fix`` writes for
them, each trained on the tabular policy of ``examples/tabular.py`` (every
expectation exact). The fixed losses reach the regularised optimum
``pi* ~ pi_ref * exp(r / beta)``; the originals settle elsewhere."""

from __future__ import annotations

import importlib
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest
from click.testing import CliRunner

from kllint.cli import main

torch = pytest.importorskip("torch")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
BETA = 1.0
STEPS = 300
BATCH = 256

LOSSES = """\
import torch


def advantages_of(rewards):
    return rewards - (rewards.sum() - rewards) / (rewards.numel() - 1)


def loss_k1(per_token_logps, ref_per_token_logps, rewards, completion_mask, beta):
    per_token_kl = per_token_logps - ref_per_token_logps
    per_token_loss = -advantages_of(rewards).unsqueeze(1) * per_token_logps + beta * per_token_kl
    return (per_token_loss * completion_mask).sum(dim=1).mean()


def loss_k3(per_token_logps, ref_per_token_logps, rewards, completion_mask, beta):
    ratio = torch.exp(per_token_logps - per_token_logps.detach())
    per_token_kl = torch.exp(ref_per_token_logps - per_token_logps) - (ref_per_token_logps - per_token_logps) - 1
    per_token_loss = -ratio * advantages_of(rewards).unsqueeze(1) + beta * per_token_kl
    return (per_token_loss * completion_mask).sum(dim=1).mean()


def loss_token_k2(per_token_logps, ref_per_token_logps, rewards, completion_mask, beta):
    pg_loss = -(advantages_of(rewards) * (per_token_logps * completion_mask).sum(dim=1)).mean()
    per_token_kl = 0.5 * (per_token_logps - ref_per_token_logps) ** 2
    kl_loss = (per_token_kl * completion_mask).sum(dim=1).mean()
    return pg_loss + beta * kl_loss
"""


@pytest.fixture(scope="module")
def modules(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModuleType, ModuleType, ModuleType]:
    folder = tmp_path_factory.mktemp("training")
    shutil.copy(EXAMPLES / "tabular.py", folder / "tabular.py")
    (folder / "buggy_losses.py").write_text(LOSSES)
    (folder / "fixed_losses.py").write_text(LOSSES)
    result = CliRunner().invoke(main, ["--fix", str(folder / "fixed_losses.py")])
    assert result.exit_code == 0, result.output  # every finding fixed
    sys.path.insert(0, str(folder))
    try:
        tabular = importlib.import_module("tabular")
        buggy = importlib.import_module("buggy_losses")
        fixed = importlib.import_module("fixed_losses")
    finally:
        sys.path.remove(str(folder))
    return tabular, buggy, fixed


def objective(tabular: ModuleType, loss: object) -> tuple[float, float]:
    policy, reference = tabular.train(loss, BETA, STEPS, BATCH)
    kl = tabular.true_kl(policy, reference)
    return kl, tabular.expected_reward(policy) - BETA * kl


@pytest.mark.parametrize("name", ["loss_k1", "loss_k3", "loss_token_k2"])
def test_fixed_loss_reaches_the_regularised_optimum_and_the_original_does_not(
    modules: tuple[ModuleType, ModuleType, ModuleType], name: str
) -> None:
    tabular, buggy, fixed = modules
    _, reference = tabular.initial_policies()
    best, kl_star = tabular.best_objective(reference, BETA)
    kl_fixed, value_fixed = objective(tabular, getattr(fixed, name))
    kl_buggy, value_buggy = objective(tabular, getattr(buggy, name))
    print(
        f"{name}: original KL {kl_buggy:.3f} objective {value_buggy:.3f}; "
        f"fixed KL {kl_fixed:.3f} objective {value_fixed:.3f}; optimum KL {kl_star:.3f} "
        f"objective {best:.3f}"
    )
    assert abs(kl_fixed - kl_star) < 0.05
    assert best - value_fixed < 0.03
    assert best - value_buggy > 0.05
