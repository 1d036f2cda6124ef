"""verl-style PPO: KL(pi || pi_ref) in the reward, GAE, and a k3 metric.

The trainer's settings are a tree of dataclasses. The KL enters the token
rewards (``use_kl_in_reward``) with the ``kl`` estimator under ``no_grad``,
the advantages are GAE returns, and the actor logs the low-variance
estimate of the KL to the reference as a metric only.
"""

from dataclasses import dataclass, field
from typing import Any, Dict, Tuple

import torch
import torch.nn.functional as F


@dataclass
class AlgorithmConfig:
    gamma: float = 1.0
    lam: float = 1.0
    use_kl_in_reward: bool = True
    kl_penalty: str = "kl"
    kl_coef: float = 0.001


@dataclass
class ActorConfig:
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28
    loss_agg_mode: str = "token-mean"
    kl_metric_type: str = "low_var_kl"


@dataclass
class TrainerConfig:
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)


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


@torch.no_grad()
def apply_kl_penalty(data: Dict[str, torch.Tensor], kl_coef: float, kl_penalty_type: str = "kl") -> Dict[str, torch.Tensor]:
    response_mask = data["response_mask"]
    # ok: KL001
    kld = kl_penalty(data["old_log_probs"], data["ref_log_prob"], kl_penalty=kl_penalty_type)
    data["token_level_rewards"] = data["token_level_scores"] - kl_coef * kld * response_mask
    return data


@torch.no_grad()
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor, values: torch.Tensor, response_mask: torch.Tensor, gamma: float, lam: float
) -> Tuple[torch.Tensor, torch.Tensor]:
    lastgaelam = 0
    advantages_reversed = []
    gen_len = token_level_rewards.shape[-1]
    for t in reversed(range(gen_len)):
        nextvalues = values[:, t + 1] if t < gen_len - 1 else 0.0
        delta = token_level_rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam = delta + gamma * lam * lastgaelam
        advantages_reversed.append(lastgaelam)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)
    returns = advantages + values
    return advantages * response_mask, returns


def compute_policy_loss(old_log_prob, log_prob, advantages, response_mask, clip_low, clip_high, loss_agg_mode):
    negative_approx_kl = log_prob - old_log_prob
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    return agg_loss(torch.maximum(pg_losses1, pg_losses2), response_mask, loss_agg_mode)


class DataParallelPPOActor:
    def __init__(self, config: ActorConfig, actor_module: torch.nn.Module):
        self.config = config
        self.actor_module = actor_module

    def compute_loss(self, logits: torch.Tensor, micro_batch: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, Dict[str, Any]]:
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
        metrics: Dict[str, Any] = {"actor/pg_loss": policy_loss.item()}
        with torch.no_grad():
            # ok: KL002, KL004
            kl_metric = kl_penalty(log_prob, micro_batch["ref_log_prob"], kl_penalty=self.config.kl_metric_type)
            metrics["actor/ref_kl_low_var"] = agg_loss(kl_metric, response_mask, "token-mean").item()
        return policy_loss, metrics


class RayPPOTrainer:
    def __init__(self, config: TrainerConfig, actor_module: torch.nn.Module, critic):
        self.config = config
        self.critic = critic
        self.actor = DataParallelPPOActor(config.actor, actor_module)

    @torch.no_grad()
    def compute_advantage(self, batch: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        algo = self.config.algorithm
        if algo.use_kl_in_reward:
            batch = apply_kl_penalty(batch, algo.kl_coef, kl_penalty_type=algo.kl_penalty)
        else:
            batch["token_level_rewards"] = batch["token_level_scores"]
        advantages, returns = compute_gae_advantage_return(
            batch["token_level_rewards"], batch["values"], batch["response_mask"], algo.gamma, algo.lam
        )
        batch["advantages"] = advantages
        batch["returns"] = returns
        return batch

    def update_actor(self, batch: Dict[str, torch.Tensor]) -> Dict[str, Any]:
        response_length = batch["responses"].size(-1)
        logits = self.actor.actor_module(input_ids=batch["input_ids"]).logits[:, -response_length - 1 : -1]
        loss, metrics = self.actor.compute_loss(logits, batch)
        loss.backward()
        return metrics
