"""Policy-gradient loss as an ``nn.Module`` whose ``forward`` takes a
``kl_type`` keyword (NeMo-RL ClippedPGLossFn style), with the per-token KL
reduced in a separate ``masked_sum`` helper.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


def masked_sum(values, mask, axis=None):
    if axis is None:
        return (values * mask).sum()
    return (values * mask).sum(axis)


class KLRegularizedPGLoss(nn.Module):
    def __init__(self, beta: float = 0.05):
        super().__init__()
        self.beta = beta

    def forward(self, logprobs, ref_logprobs, advantages, mask, *, kl_type="token_k2"):
        pg = -masked_sum(advantages.unsqueeze(-1) * logprobs, mask, axis=-1)
        log_ratio = logprobs - ref_logprobs
        if kl_type == "sequence_k2":
            # ok: KL003
            kl = 0.5 * masked_sum(log_ratio, mask, axis=-1) ** 2
        elif kl_type == "token_k2":
            # error: KL003
            kl = masked_sum(0.5 * log_ratio.pow(2), mask, axis=-1)
        else:
            raise ValueError(f"unknown kl_type {kl_type}")
        return (pg + self.beta * kl).mean()


@dataclass
class LossConfig:
    kl_type: str = "token_k2"
    beta: float = 0.05


class Learner:
    def __init__(self, cfg: LossConfig | None = None):
        self.cfg = cfg or LossConfig()
        self.loss_fn = KLRegularizedPGLoss(beta=self.cfg.beta)

    def train_step(self, logprobs, batch):
        loss = self.loss_fn(
            logprobs, batch["ref_logprobs"], batch["advantages"], batch["mask"], kl_type=self.cfg.kl_type
        )
        loss.backward()
        return loss.detach()
