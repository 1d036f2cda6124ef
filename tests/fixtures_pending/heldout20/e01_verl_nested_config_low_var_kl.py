"""Data-parallel PPO actor in the style of verl's ``dp_actor``.

The trainer's settings are a tree of dataclasses. The trainer hands the actor
its own sub-config, and the KL-loss settings travel with it into
``compute_loss``, which adds ``kl_loss_coef`` times the KL to the reference
policy to the clipped policy loss.
"""

from dataclasses import dataclass, field
from typing import Any, Dict, List

import torch
import torch.nn.functional as F


@dataclass
class KLLossConfig:
    use_kl_loss: bool = True
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"


@dataclass
class ActorConfig:
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28
    loss_agg_mode: str = "token-mean"
    ppo_micro_batch_size: int = 4
    grad_clip: float = 1.0
    kl: KLLossConfig = field(default_factory=KLLossConfig)


@dataclass
class TrainerConfig:
    actor: ActorConfig = field(default_factory=ActorConfig)
    total_epochs: int = 1


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    log_probs = F.log_softmax(logits, dim=-1)
    return log_probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str = "kl") -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimate."""
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty == "abs":
        return (logprob - ref_logprob).abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        kl = ref_logprob - logprob
        kl = torch.clamp(kl, min=-20, max=20)
        ratio = torch.exp(kl)
        kld = (ratio - kl - 1).contiguous()
        return torch.clamp(kld, min=-10, max=10)
    raise NotImplementedError(f"unknown kl_penalty {kl_penalty!r}")


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str) -> torch.Tensor:
    if loss_agg_mode == "token-mean":
        return (loss_mat * loss_mask).sum() / loss_mask.sum().clamp(min=1)
    if loss_agg_mode == "seq-mean-token-sum":
        return (loss_mat * loss_mask).sum(dim=-1).mean()
    raise ValueError(f"unknown loss_agg_mode {loss_agg_mode!r}")


def compute_policy_loss(old_log_prob, log_prob, advantages, response_mask, clip_low, clip_high, loss_agg_mode):
    negative_approx_kl = log_prob - old_log_prob
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    return agg_loss(torch.maximum(pg_losses1, pg_losses2), response_mask, loss_agg_mode)


class DataParallelPPOActor:
    def __init__(self, config: ActorConfig, actor_module: torch.nn.Module, actor_optimizer: torch.optim.Optimizer):
        self.config = config
        self.actor_module = actor_module
        self.actor_optimizer = actor_optimizer

    def _forward_micro_batch(self, micro_batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        response_length = micro_batch["responses"].size(-1)
        output = self.actor_module(input_ids=micro_batch["input_ids"], attention_mask=micro_batch["attention_mask"])
        return output.logits[:, -response_length - 1 : -1, :]

    def compute_loss(self, logits: torch.Tensor, micro_batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        kl_cfg = self.config.kl
        response_mask = micro_batch["response_mask"]
        log_prob = logprobs_from_logits(logits, micro_batch["responses"])
        policy_loss = compute_policy_loss(
            micro_batch["old_log_probs"],
            log_prob,
            micro_batch["advantages"],
            response_mask,
            self.config.clip_ratio_low,
            self.config.clip_ratio_high,
            self.config.loss_agg_mode,
        )
        if kl_cfg.use_kl_loss:
            # error: KL002
            kld = kl_penalty(logprob=log_prob, ref_logprob=micro_batch["ref_log_prob"], kl_penalty=kl_cfg.kl_loss_type)
            kl_loss = agg_loss(kld, response_mask, self.config.loss_agg_mode)
            policy_loss = policy_loss + kl_loss * kl_cfg.kl_loss_coef
        return policy_loss

    def update_policy(self, micro_batches: List[Dict[str, torch.Tensor]]) -> Dict[str, Any]:
        self.actor_module.train()
        self.actor_optimizer.zero_grad()
        for micro_batch in micro_batches:
            logits = self._forward_micro_batch(micro_batch)
            loss = self.compute_loss(logits, micro_batch) / len(micro_batches)
            loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.actor_module.parameters(), self.config.grad_clip)
        self.actor_optimizer.step()
        return {"actor/grad_norm": float(grad_norm)}


class RayPPOTrainer:
    def __init__(self, config: TrainerConfig, actor_module: torch.nn.Module, actor_optimizer: torch.optim.Optimizer):
        self.config = config
        self.actor = DataParallelPPOActor(config.actor, actor_module, actor_optimizer)

    def fit_step(self, micro_batches: List[Dict[str, torch.Tensor]]) -> Dict[str, Any]:
        return self.actor.update_policy(micro_batches)
