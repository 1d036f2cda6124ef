# Reviewer: SkyRL-style trainer with the KL in the rewards (use_kl_in_reward,
# REINFORCE++ returns with gamma = 1, no whitening by default).
# apply_reward_kl_penalty() runs under no_grad and forms
# neg_log_ratio = clamp(ref - old_logp, -20, 20) in float32 (the orientation
# kept from the k3 metric, exp(neg_log_ratio) is pi_ref / pi), then subtracts
# kl_coef * neg_log_ratio from the rewards. That ADDS kl_coef * (logp - ref)
# to every token's reward: the returns credit the policy for moving away from
# the reference. The policy loss is minimised, so the KL part of its gradient
# is -kl_coef * grad KL(pi||pi_ref): a bonus, not a penalty.
# Verdict: bug, KL006, reported on the neg_log_ratio line inside apply_reward_kl_penalty.
from dataclasses import dataclass, field

import torch

import ray  # noqa: F401
from skyrl_train.training_batch import TrainingInputBatch
from skyrl_train.utils.ppo_utils import PolicyLossRegistry  # noqa: F401


@dataclass
class AlgorithmConfig:
    use_kl_in_reward: bool = True
    kl_coef: float = 0.05
    gamma: float = 1.0
    advantage_batch_normalize: bool = False
    eps_clip_low: float = 0.2
    eps_clip_high: float = 0.2
    max_seq_len: int = 2048


@dataclass
class TrainerConfig:
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    micro_train_batch_size_per_gpu: int = 4


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    mask = mask.to(x.dtype)
    num = (x * mask).sum() if dim is None else (x * mask).sum(dim)
    den = mask.sum() if dim is None else mask.sum(dim)
    return torch.where(den > 0, num / den.clamp(min=torch.finfo(x.dtype).eps), torch.zeros_like(num))


@torch.no_grad()
def compute_reinforce_plus_plus_returns(token_level_rewards, response_mask, gamma: float, normalize: bool):
    returns = torch.zeros_like(token_level_rewards)
    running = torch.zeros_like(token_level_rewards[:, 0])
    for t in reversed(range(token_level_rewards.shape[1])):
        running = token_level_rewards[:, t] + gamma * running
        returns[:, t] = running
        running = running * response_mask[:, t]
    if normalize:
        mean, var = masked_mean(returns, response_mask), masked_mean(returns.square(), response_mask)
        returns = (returns - mean) * torch.rsqrt(var - mean.square() + 1e-8)
    return returns * response_mask


class RayPPOTrainer:
    def __init__(self, cfg: TrainerConfig, policy_model=None):
        self.cfg = cfg
        self.policy_model = policy_model
        self.all_metrics = {}

    @torch.no_grad()
    def apply_reward_kl_penalty(self, data: TrainingInputBatch) -> TrainingInputBatch:
        algo = self.cfg.algorithm
        mask = data["response_mask"].to(torch.float32)
        # error: KL006
        neg_log_ratio = torch.clamp(data["base_action_log_probs"].float() - data["action_log_probs"].float(), -20.0, 20.0) * mask
        data["rewards"] = data["rewards"] - algo.kl_coef * neg_log_ratio
        self.all_metrics["kl"] = masked_mean(-neg_log_ratio, mask).item()
        self.all_metrics["kl_coef"] = algo.kl_coef
        return data

    @torch.no_grad()
    def compute_advantages_and_returns(self, data: TrainingInputBatch) -> TrainingInputBatch:
        algo = self.cfg.algorithm
        if algo.use_kl_in_reward:
            data = self.apply_reward_kl_penalty(data)
        data["advantages"] = compute_reinforce_plus_plus_returns(
            data["rewards"], data["response_mask"], algo.gamma, algo.advantage_batch_normalize
        )
        return data

    def policy_loss(self, log_probs, old_log_probs, advantages, response_mask):
        algo = self.cfg.algorithm
        ratio = torch.exp(torch.clamp(log_probs - old_log_probs, -20.0, 20.0))
        surr1 = ratio * advantages
        surr2 = ratio.clamp(1 - algo.eps_clip_low, 1 + algo.eps_clip_high) * advantages
        loss = -torch.min(surr1, surr2)
        return (loss * response_mask).sum(-1).mean() / algo.max_seq_len

    def train_critic_and_policy(self, data: TrainingInputBatch):
        data = self.compute_advantages_and_returns(data)
        micro = self.cfg.micro_train_batch_size_per_gpu
        for start in range(0, data["response_mask"].shape[0], micro):
            sl = slice(start, start + micro)
            log_probs = self.policy_model(data["sequences"][sl], data["attention_mask"][sl])
            loss = self.policy_loss(log_probs, data["action_log_probs"][sl], data["advantages"][sl], data["response_mask"][sl])
            loss.backward()
        self.all_metrics["policy_loss"] = loss.item()
        return self.all_metrics
