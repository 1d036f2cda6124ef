"""Per-sample loops over batch rows, and the counts a loss is divided by:
a difference of two packed responses' pieces is one response's tokens
(summed, a sum over time), ``logps[i, :n]`` in a loop over the samples is
one response's row, and ``-(-n // size)``, Python's ceiling division, is a
positive number of micro-batches, not a negated loss. Each has its correct
twin, which stays quiet."""

from __future__ import annotations

import textwrap
from pathlib import Path

from kllint.engine import lint_paths


def findings(tmp_path: Path, source: str) -> list[tuple[int, str]]:
    path = tmp_path / "loss.py"
    path.write_text(textwrap.dedent(source))
    return [(f.line, f.code) for f in lint_paths([path], jobs=1).findings]


PACKED_PIECES = """
import torch


def policy_loss(log_probs, ref_log_probs, response_lengths, kl_loss_coef=0.02):
    lengths = response_lengths.tolist()
    kl_terms = []
    for lp, ref in zip(torch.split(log_probs, lengths), torch.split(ref_log_probs, lengths)):
        log_ratio = lp - ref
        {kl_line}
    kl_loss = torch.stack(kl_terms).mean()
    loss = kl_loss_coef * kl_loss
    loss.backward()
"""


def test_a_k2_summed_over_a_packed_response_is_reported(tmp_path: Path) -> None:
    # ``log_ratio`` holds one response's tokens, as ``lp`` and ``ref`` do.
    kl_line = "kl_terms.append(0.5 * log_ratio.pow(2).sum())"
    assert findings(tmp_path, PACKED_PIECES.format(kl_line=kl_line)) == [(10, "KL003")]


def test_a_k2_of_a_packed_response_s_sum_says_nothing(tmp_path: Path) -> None:
    kl_line = "kl_terms.append(0.5 * log_ratio.sum().pow(2))"
    assert findings(tmp_path, PACKED_PIECES.format(kl_line=kl_line)) == []


ROWS_BY_INDEX = """
import torch


def kl_loss(per_token_logps, ref_per_token_logps, completion_mask, beta=0.05):
    lengths = completion_mask.sum(dim=1).long().tolist()
    per_sample_kl = []
    for i, n in enumerate(lengths):
        seq_log_ratio = per_token_logps[i, :n].sum() - ref_per_token_logps[i, :n].sum()
        {kl_line}
    loss = beta * sum(per_sample_kl) / len(per_sample_kl)
    loss.backward()
"""


def test_a_k1_of_each_sample_s_row_is_reported(tmp_path: Path) -> None:
    # ``per_token_logps[i, :n]`` is sample i's tokens: its sum is over time,
    # so the term is the sequence's k1, whose expected gradient is zero.
    kl_line = "per_sample_kl.append(seq_log_ratio)"
    assert findings(tmp_path, ROWS_BY_INDEX.format(kl_line=kl_line)) == [(9, "KL001")]


def test_a_k2_of_each_sample_s_row_says_nothing(tmp_path: Path) -> None:
    kl_line = "per_sample_kl.append(0.5 * seq_log_ratio ** 2)"
    assert findings(tmp_path, ROWS_BY_INDEX.format(kl_line=kl_line)) == []


CEILING_DIVISION = """
import torch


def training_step(policy, batch, micro_batch_size=2, kl_coef=0.1):
    n_micro = -(-batch["input_ids"].size(0) // micro_batch_size)
    logits = policy(batch["input_ids"]).logits
    logps = torch.gather(logits.log_softmax(-1), -1, batch["labels"][..., None]).squeeze(-1)
    ref_logps = batch["ref_logps"]
    seq_log_ratio = ((logps - ref_logps) * batch["mask"]).sum(-1)
    pg_loss = -(batch["advantages"] * (logps * batch["mask"]).sum(-1)).mean()
    kl = 0.5 * (seq_log_ratio ** 2).mean()
    {loss_line}
    loss.backward()
"""


def test_a_loss_over_a_ceiling_division_says_nothing(tmp_path: Path) -> None:
    # ``-(-n // size)`` is the number of micro-batches, positive.
    loss_line = "loss = (pg_loss + kl_coef * kl) / n_micro"
    assert findings(tmp_path, CEILING_DIVISION.format(loss_line=loss_line)) == []


def test_a_negated_kl_over_a_ceiling_division_is_reported(tmp_path: Path) -> None:
    loss_line = "loss = (pg_loss - kl_coef * kl) / n_micro"
    assert findings(tmp_path, CEILING_DIVISION.format(loss_line=loss_line)) == [(12, "KL006")]


ADAPTIVE_COEFFICIENT = """
import torch


class Trainer:
    def __init__(self, args):
        self.args = args
        self.kl_ctl_value = args.init_kl_coef

    def training_step(self, logps, ref_logps, mask):
        log_ratio = (logps - ref_logps).clamp(min=-10.0, max=10.0)
        {kl_line}
        loss = kl_loss * self.kl_ctl_value
        loss.backward()
"""


def test_a_token_k2_scaled_by_an_adaptive_coefficient_is_reported(tmp_path: Path) -> None:
    # ``kl_ctl_value`` is the KL controller's value, a coefficient (as
    # ``self.kl_ctl.value`` is), not a critic's value.
    kl_line = "kl_loss = (log_ratio.square() / 2.0 * mask).sum()"
    assert findings(tmp_path, ADAPTIVE_COEFFICIENT.format(kl_line=kl_line)) == [(12, "KL003")]


def test_a_sequence_k2_scaled_by_an_adaptive_coefficient_says_nothing(tmp_path: Path) -> None:
    kl_line = "kl_loss = ((log_ratio * mask).sum(-1).square() / 2.0).mean()"
    assert findings(tmp_path, ADAPTIVE_COEFFICIENT.format(kl_line=kl_line)) == []


ACCUMULATED = """
import itertools

import torch


def kl_penalty(logps, ref_logps, mask, beta=0.05):
    log_ratio = ((logps - ref_logps) * mask).detach()
    {weights_line}
    kl_penalty = (weights * logps * mask).sum(-1).mean()
    loss = beta * kl_penalty
    loss.backward()
"""


def test_a_prefix_sum_built_with_accumulate_is_reported(tmp_path: Path) -> None:
    # ``accumulate`` adds forward: each token is weighted by the KL before
    # it, not by the KL still to come.
    weights_line = "weights = torch.stack(list(itertools.accumulate(log_ratio.unbind(-1))), dim=-1)"
    assert findings(tmp_path, ACCUMULATED.format(weights_line=weights_line)) == [(10, "KL003")]


def test_the_reward_to_go_written_with_flips_says_nothing(tmp_path: Path) -> None:
    weights_line = "weights = log_ratio.flip(-1).cumsum(-1).flip(-1)"
    assert findings(tmp_path, ACCUMULATED.format(weights_line=weights_line)) == []


NUMPY_REWARDS = """
import numpy as np
import torch


def token_rewards(old_log_probs, ref_log_probs, response_mask, scores, kl_coef=0.05):
    old = old_log_probs.detach().cpu().numpy()
    ref = ref_log_probs.detach().cpu().numpy()
    mask = response_mask.detach().cpu().numpy().astype(old.dtype)
    log_ratio = (old - ref) * mask
    {kl_line}
    rewards = scores.cpu().numpy() - kl_coef * kl
    returns = np.zeros_like(rewards)
    running = np.zeros(rewards.shape[0], dtype=rewards.dtype)
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + running
        returns[:, t] = running
    return torch.as_tensor(returns * mask)


def train_step(log_probs, batch):
    returns = token_rewards(
        batch["old_log_probs"], batch["ref_log_probs"], batch["mask"], batch["scores"]
    )
    loss = -(returns * log_probs * batch["mask"]).sum(-1).mean()
    loss.backward()
"""


def test_a_k3_reward_computed_in_numpy_is_reported(tmp_path: Path) -> None:
    # ``.numpy().astype(old.dtype)`` is the mask cast, not an unknown factor.
    kl_line = "kl = (np.expm1(-log_ratio) + log_ratio) * mask"
    assert findings(tmp_path, NUMPY_REWARDS.format(kl_line=kl_line)) == [(11, "KL004")]


def test_a_k1_reward_computed_in_numpy_says_nothing(tmp_path: Path) -> None:
    kl_line = "kl = log_ratio * mask"
    assert findings(tmp_path, NUMPY_REWARDS.format(kl_line=kl_line)) == []
