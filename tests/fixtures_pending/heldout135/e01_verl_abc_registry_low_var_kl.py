# Reviewer: verl-style actor whose KL-loss estimators are subclasses of an
# abstract KLEstimator, registered by __init_subclass__(name=...) and built by
# name from ActorConfig.kl_loss_type, default "low_var_kl" (k3). The per-token
# k3 is added to the loss with its gradient and summed over the response tokens:
# its expected gradient is the token-level gradient of KL(pi_ref||pi).
# Verdict: bug, KL002, reported where the loss calls the estimator.
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch

from verl import DataProto
from verl.utils.torch_functional import logprobs_from_logits


class KLEstimator(ABC):
    """Base class; subclasses register themselves under a config name."""

    registry: ClassVar[dict[str, type[KLEstimator]]] = {}
    name: ClassVar[str] = ""

    def __init_subclass__(cls, name: str = "", **kwargs):
        super().__init_subclass__(**kwargs)
        if name:
            cls.name = name
            KLEstimator.registry[name] = cls

    @abstractmethod
    def estimate(self, log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
        """Per-token KL(pi||pi_ref) estimate, shape [bs, response_length]."""

    @classmethod
    def build(cls, name: str) -> KLEstimator:
        if name not in cls.registry:
            raise ValueError(f"unknown kl estimator {name!r}; known: {sorted(cls.registry)}")
        return cls.registry[name]()


class KLK1(KLEstimator, name="kl"):
    def estimate(self, log_prob, ref_log_prob):
        # ok: KL001
        return log_prob - ref_log_prob


class KLAbs(KLEstimator, name="abs"):
    def estimate(self, log_prob, ref_log_prob):
        return (log_prob - ref_log_prob).abs()


class KLMSE(KLEstimator, name="mse"):
    def estimate(self, log_prob, ref_log_prob):
        # ok: KL003
        return 0.5 * (log_prob - ref_log_prob).square()


class KLLowVar(KLEstimator, name="low_var_kl"):
    def estimate(self, log_prob, ref_log_prob):
        kl = torch.clamp(ref_log_prob - log_prob, min=-20, max=20)
        # ok: KL002
        return torch.exp(kl) - kl - 1


@dataclass
class ActorConfig:
    clip_ratio: float = 0.2
    use_kl_loss: bool = True
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    ppo_micro_batch_size: int = 4


class DataParallelPPOActor:
    def __init__(self, config: ActorConfig, actor_module=None, actor_optimizer=None):
        self.config = config
        self.actor_module = actor_module
        self.actor_optimizer = actor_optimizer
        self.kl_estimator = KLEstimator.build(config.kl_loss_type)

    def _forward_micro_batch(self, micro_batch):
        output = self.actor_module(input_ids=micro_batch["input_ids"], attention_mask=micro_batch["attention_mask"])
        logits = output.logits[:, -micro_batch["responses"].shape[-1] - 1 : -1]
        return logprobs_from_logits(logits, micro_batch["responses"])

    def compute_policy_loss(self, log_prob, old_log_prob, ref_log_prob, advantages, response_mask):
        cfg = self.config
        ratio = torch.exp(log_prob - old_log_prob)
        pg_losses = -advantages * ratio
        pg_losses2 = -advantages * torch.clamp(ratio, 1 - cfg.clip_ratio, 1 + cfg.clip_ratio)
        pg_loss = (torch.maximum(pg_losses, pg_losses2) * response_mask).sum(-1).mean()
        metrics = {"actor/pg_loss": pg_loss.item()}
        policy_loss = pg_loss
        if cfg.use_kl_loss:
            # error: KL002
            kld = self.kl_estimator.estimate(log_prob, ref_log_prob)
            kl_loss = (kld * response_mask).sum(-1).mean()
            policy_loss = policy_loss + cfg.kl_loss_coef * kl_loss
            metrics["actor/kl_loss"] = kl_loss.item()
            metrics["actor/kl_estimator"] = self.kl_estimator.name
        return policy_loss, metrics

    def update_policy(self, data: DataProto):
        self.actor_module.train()
        metrics = {}
        for micro_batch in data.split(self.config.ppo_micro_batch_size):
            log_prob = self._forward_micro_batch(micro_batch)
            loss, m = self.compute_policy_loss(
                log_prob,
                micro_batch["old_log_probs"],
                micro_batch["ref_log_prob"],
                micro_batch["advantages"],
                micro_batch["response_mask"],
            )
            loss.backward()
            metrics.update(m)
        torch.nn.utils.clip_grad_norm_(self.actor_module.parameters(), max_norm=1.0)
        self.actor_optimizer.step()
        self.actor_optimizer.zero_grad()
        return metrics
