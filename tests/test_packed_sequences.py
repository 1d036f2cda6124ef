"""Packed sequences and the settings a loss object falls back to: a
reward-to-go that restarts at each packed sequence's end (``csum[ends][seg]
- csum + x``, with ``ends = cu_seqlens[1:].long() - 1``, also when a flag
makes the rewards a choice), rows copied into a nested tensor (without their
graph) or viewed as one (with it), and ``cfg = cfg or default_loss_config()``
in a constructor no caller gives settings to. Each has its correct twin,
which stays quiet."""

from __future__ import annotations

import textwrap
from pathlib import Path

from kllint.engine import lint_paths


def findings(tmp_path: Path, source: str) -> list[tuple[int, str]]:
    path = tmp_path / "loss.py"
    path.write_text(textwrap.dedent(source))
    return [(f.line, f.code) for f in lint_paths([path], jobs=1).findings]


PACKED_RETURNS = """
from dataclasses import dataclass

import torch


@dataclass
class Config:
    add_token_level_kl: bool = True
    kl_coef: float = 0.05


def approx_kl(log_probs, ref_log_probs):
    log_ratio = log_probs - ref_log_probs
    {kl_line}


@torch.no_grad()
def packed_rewards(batch, cfg: Config):
    rewards = torch.zeros_like(batch["old_log_probs"])
    if cfg.add_token_level_kl:
        kl = approx_kl(batch["old_log_probs"], batch["ref_log_probs"])
        rewards = rewards - cfg.kl_coef * kl
    csum = rewards.cumsum(0)
    end_csum = csum[batch["cu_seqlens"][1:].long() - 1]
    batch["advantages"] = end_csum[batch["seg"]] - csum + rewards
    return batch


def loss_fn(batch, log_probs):
    ratio = torch.exp(log_probs - batch["old_log_probs"])
    loss = -(batch["advantages"] * ratio * batch["response_mask"]).sum()
    loss.backward()
"""


def test_a_k1_reward_credited_within_each_packed_sequence_says_nothing(tmp_path: Path) -> None:
    # The running sum at each sequence's last token, spread back over its
    # tokens, minus the running sum: the KL still to come in the sequence.
    kl_line = "return log_ratio"
    assert findings(tmp_path, PACKED_RETURNS.format(kl_line=kl_line)) == []


def test_a_k3_reward_credited_within_each_packed_sequence_is_reported(tmp_path: Path) -> None:
    kl_line = "return torch.exp(-log_ratio) - 1 + log_ratio"
    assert findings(tmp_path, PACKED_RETURNS.format(kl_line=kl_line)) == [(22, "KL004")]


NESTED = """
import torch


def padded_from_packed(values, response_lens):
    pieces = list(torch.split(values, response_lens, dim=0))
    nested = torch.nested.{make}(pieces)
    return nested.to_padded_tensor(0.0)


def compute_loss(logps, ref_logps, old_logps, advantages, mask, response_lens, beta=0.05):
    ratio = torch.exp(logps - old_logps)
    pg_loss = -(advantages * ratio * mask).sum()
    seq_kl = 0.5 * padded_from_packed((logps - ref_logps) * mask, response_lens).sum(-1).square()
    loss = pg_loss + beta * seq_kl.mean()
    loss.backward()
"""


def test_rows_copied_into_a_nested_tensor_lose_their_gradient(tmp_path: Path) -> None:
    # ``torch.nested.nested_tensor`` copies its pieces, as ``torch.tensor`` does.
    assert findings(tmp_path, NESTED.format(make="nested_tensor")) == [(14, "KL005")]


def test_rows_viewed_as_a_nested_tensor_keep_it(tmp_path: Path) -> None:
    assert findings(tmp_path, NESTED.format(make="as_nested_tensor")) == []


FALLBACK_SETTINGS = """
import torch


def default_loss_config():
    return {{"kl_penalty": 0.01, "reference_policy_kl_type": "{kl_type}"}}


def k1(logprobs, ref_logprobs):
    return logprobs - ref_logprobs


def k2(logprobs, ref_logprobs):
    return 0.5 * (logprobs - ref_logprobs).pow(2)


def k3(logprobs, ref_logprobs):
    r = ref_logprobs - logprobs
    return torch.expm1(r) - r


KL_PENALTIES = {{"k1": k1, "k2": k2, "k3": k3}}


class SequenceKLLoss:
    def __init__(self, cfg=None):
        cfg = cfg or default_loss_config()
        self.kl_penalty = cfg["kl_penalty"]
        self.kl_type = cfg["reference_policy_kl_type"]

    def __call__(self, logprobs, ref_logprobs, mask):
        seq_logprobs = (logprobs * mask).sum(-1)
        seq_ref_logprobs = (ref_logprobs * mask).sum(-1)
        kl = KL_PENALTIES[self.kl_type](seq_logprobs, seq_ref_logprobs)
        loss = self.kl_penalty * kl.mean()
        loss.backward()
"""


def test_the_settings_a_constructor_falls_back_to_pick_the_estimator(tmp_path: Path) -> None:
    # ``cfg = cfg or default_loss_config()``: no caller passes ``cfg``, so
    # ``self.kl_type`` is "k3", a sequence k3 differentiated as a loss.
    assert findings(tmp_path, FALLBACK_SETTINGS.format(kl_type="k3")) == [(34, "KL002")]


def test_a_sequence_k2_by_those_settings_says_nothing(tmp_path: Path) -> None:
    assert findings(tmp_path, FALLBACK_SETTINGS.format(kl_type="k2")) == []
