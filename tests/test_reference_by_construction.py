"""A reference model is known by how the file builds it as well as by its
name: a frozen copy of the policy is the reference, whatever it is called;
a copy named as the old policy stays the behaviour policy."""

from __future__ import annotations

import textwrap
from pathlib import Path

from kllint.engine import lint_paths

TRAINER = """
import copy

import torch


class Trainer:
    def __init__(self, policy):
        self.policy = policy
        self.{copy_name} = copy.deepcopy(policy){freeze}

    def _logps(self, model, ids):
        logits = model(ids).logits[:, :-1]
        return logits.log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)

    def loss(self, ids, advantages, mask):
        logps = self._logps(self.policy, ids)
        with torch.no_grad():
            other = self._logps(self.{copy_name}, ids)
        ratio = torch.exp(other - logps)
        pg = -(torch.exp(logps - logps.detach()) * advantages[:, None] * mask).sum(-1).mean()
        kl = ((ratio - torch.log(ratio) - 1) * mask).sum(-1).mean()
        return pg + 0.05 * kl

    def step(self, batch, optimizer):
        loss = self.loss(batch["ids"], batch["advantages"], batch["mask"])
        loss.backward()
        optimizer.step()
"""


def codes(tmp_path: Path, copy_name: str, freeze: str) -> list[str]:
    path = tmp_path / "trainer.py"
    path.write_text(textwrap.dedent(TRAINER.format(copy_name=copy_name, freeze=freeze)))
    return [f.code for f in lint_paths([path], jobs=1).findings]


def test_a_frozen_copy_of_the_policy_is_the_reference(tmp_path: Path) -> None:
    # k3 of the snapshot's log-probs differentiated as a loss.
    assert codes(tmp_path, "snapshot", ".eval().requires_grad_(False)") == ["KL002"]


def test_an_unfrozen_copy_says_nothing(tmp_path: Path) -> None:
    # A working copy of the model (``self.snapshot = deepcopy(policy)``)
    # may be trained: no reference without a name or a freeze.
    assert codes(tmp_path, "snapshot", "") == []


def test_a_copy_named_as_the_old_policy_is_not_the_reference(tmp_path: Path) -> None:
    assert "KL002" not in codes(tmp_path, "policy_old", ".eval()")
