# Reviewer: SkyRL-style policy loss. `compute_approx_kl` picks its estimator with
# a `match` on the `KLEstimator` enum; its own keyword-only default is K3, but the
# trainer always forwards the config's choice through two layers of **kwargs
# (`PolicyLossRunner.step(**cfg.loss_kwargs())` -> `ppo_policy_loss(**kwargs)` ->
# `compute_approx_kl(**kwargs)`), and AlgorithmConfig.kl_estimator_type defaults
# to K1. The loss therefore adds kl_loss_coef * k1 (the log-ratio, with
# gradient), summed over tokens and averaged over sequences: its expected
# gradient is zero.
# Verdict: bug, KL001, reported on the line of ppo_policy_loss that calls
# compute_approx_kl.
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

import ray
import torch
from torch import Tensor


class KLEstimator(str, Enum):
    K1 = "k1"
    K2 = "k2"
    K3 = "k3"


@dataclass
class AlgorithmConfig:
    eps_clip_low: float = 0.2
    eps_clip_high: float = 0.2
    use_kl_loss: bool = True
    kl_loss_coef: float = 0.001
    kl_estimator_type: KLEstimator = KLEstimator.K1
    kl_clamp: float = 10.0

    def loss_kwargs(self) -> dict[str, Any]:
        return {"estimator": self.kl_estimator_type, "clamp": self.kl_clamp}


def compute_approx_kl(
    log_probs: Tensor,
    log_probs_base: Tensor,
    *,
    mask: Tensor | None = None,
    estimator: KLEstimator = KLEstimator.K3,
    clamp: float | None = None,
) -> Tensor:
    log_ratio = log_probs - log_probs_base
    match estimator:
        case KLEstimator.K1:
            kl = log_ratio
        case KLEstimator.K2:
            kl = 0.5 * log_ratio.square()
        case KLEstimator.K3:
            kl = (-log_ratio).exp() - 1 + log_ratio
        case _:
            raise ValueError(f"unknown kl estimator {estimator}")
    if clamp is not None:
        kl = kl.clamp(-clamp, clamp)
    return kl if mask is None else kl * mask


def ppo_policy_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    base_log_probs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    cfg: AlgorithmConfig,
    **kwargs: Any,
) -> tuple[Tensor, dict[str, float]]:
    ratio = (log_probs - old_log_probs).exp()
    surr1 = ratio * advantages
    surr2 = ratio.clamp(1 - cfg.eps_clip_low, 1 + cfg.eps_clip_high) * advantages
    loss = (-torch.min(surr1, surr2) * loss_mask).sum(-1).mean()
    info = {"policy_loss": loss.item()}
    if cfg.use_kl_loss:
        # error: KL001
        kl = compute_approx_kl(log_probs, base_log_probs, mask=loss_mask, **kwargs)
        kl_loss = kl.sum(-1).mean()
        loss = loss + cfg.kl_loss_coef * kl_loss
        info["kl_loss"] = kl_loss.item()
    return loss, info


class PolicyLossRunner:
    def __init__(self, model, optimizer, cfg: AlgorithmConfig | None = None):
        self.model = model
        self.optimizer = optimizer
        self.cfg = cfg or AlgorithmConfig()

    def step(self, log_probs: Tensor, experience: dict[str, Tensor], **kwargs: Any) -> tuple[Tensor, dict[str, float]]:
        return ppo_policy_loss(
            log_probs,
            experience["action_log_probs"],
            experience["base_action_log_probs"],
            experience["advantages"],
            experience["loss_mask"],
            cfg=self.cfg,
            **kwargs,
        )

    def training_step(self, experience: dict[str, Tensor]) -> dict[str, float]:
        self.model.train()
        num_actions = experience["loss_mask"].size(1)
        log_probs = self.model(experience["sequences"], num_actions, attention_mask=experience["attention_mask"])
        loss, info = self.step(log_probs, experience, **self.cfg.loss_kwargs())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad()
        return info


@ray.remote(num_gpus=1)
class PolicyWorker:
    def __init__(self, model, optimizer, cfg: AlgorithmConfig | None = None):
        self.runner = PolicyLossRunner(model, optimizer, cfg)

    def train(self, experiences: list[dict[str, Tensor]]) -> list[dict[str, float]]:
        return [self.runner.training_step(exp) for exp in experiences]
