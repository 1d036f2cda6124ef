"""ROLL/verl-style PPO with the KL penalty applied in the rewards by a small class.

``KLRewardShaper`` holds the estimator chosen by ``AlgorithmConfig.kl_penalty``
(default ``"kl"``, the log-ratio) and an adaptive coefficient; the shaped
``token_level_rewards`` go through GAE with gamma = lam = 1 (the defaults),
so every token is credited with the KL reward of the tokens after it.
Selecting ``kl_penalty="low_var_kl"`` would put k3 in the reward.
"""

from dataclasses import dataclass
from typing import Dict, Tuple

import torch


@dataclass
class AlgorithmConfig:
    adv_estimator: str = "gae"
    gamma: float = 1.0
    lam: float = 1.0
    use_kl_in_reward: bool = True
    kl_penalty: str = "kl"
    init_kl_coef: float = 0.02
    target_kl: float = 6.0
    kl_horizon: int = 10000
    clip_ratio: float = 0.2
    micro_batch_size: int = 4


class AdaptiveKLController:
    """Adaptive KL controller described in https://arxiv.org/abs/1909.08593"""

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int):
        self.value = init_kl_coef
        self.target = target_kl
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        proportional_error = max(min(current_kl / self.target - 1, 0.2), -0.2)
        self.value *= 1 + proportional_error * n_steps / self.horizon


class KLRewardShaper:
    def __init__(self, cfg: AlgorithmConfig):
        self.kl_type = cfg.kl_penalty
        self.kl_ctrl = AdaptiveKLController(cfg.init_kl_coef, cfg.target_kl, cfg.kl_horizon)

    def estimate(self, logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
        if self.kl_type == "kl":
            return logprob - ref_logprob
        if self.kl_type == "abs":
            return (logprob - ref_logprob).abs()
        if self.kl_type == "mse":
            return 0.5 * (logprob - ref_logprob).square()
        if self.kl_type == "low_var_kl":
            kl = torch.clamp(ref_logprob - logprob, min=-20, max=20)
            return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)
        raise NotImplementedError(self.kl_type)

    @torch.no_grad()
    def __call__(
        self,
        token_level_scores: torch.Tensor,
        old_log_probs: torch.Tensor,
        ref_log_probs: torch.Tensor,
        response_mask: torch.Tensor,
    ) -> Tuple[torch.Tensor, Dict[str, float]]:
        # ok: KL001, KL003, KL004, KL006
        kld = self.estimate(old_log_probs, ref_log_probs) * response_mask
        beta = self.kl_ctrl.value
        token_level_rewards = token_level_scores - beta * kld
        current_kl = ((kld.sum(-1)) / response_mask.sum(-1).clamp(min=1)).mean().item()
        self.kl_ctrl.update(current_kl, n_steps=token_level_scores.size(0))
        return token_level_rewards, {"critic/kl": current_kl, "critic/kl_coef": beta}


def compute_gae(token_level_rewards, values, response_mask, gamma: float, lam: float):
    with torch.no_grad():
        lastgaelam = torch.zeros_like(token_level_rewards[:, 0])
        nextvalues = torch.zeros_like(token_level_rewards[:, 0])
        advantages_reversed = []
        for t in reversed(range(token_level_rewards.shape[1])):
            delta = token_level_rewards[:, t] + gamma * nextvalues - values[:, t]
            lastgaelam = (delta + gamma * lam * lastgaelam) * response_mask[:, t]
            nextvalues = values[:, t]
            advantages_reversed.append(lastgaelam)
        advantages = torch.stack(advantages_reversed[::-1], dim=1)
    return advantages, advantages + values


def ppo_loss(log_probs, old_log_probs, advantages, response_mask, clip_ratio: float) -> torch.Tensor:
    ratio = torch.exp(log_probs - old_log_probs)
    surr1 = -advantages * ratio
    surr2 = -advantages * torch.clamp(ratio, 1 - clip_ratio, 1 + clip_ratio)
    return (torch.maximum(surr1, surr2) * response_mask).sum(-1).mean()


class PPOTrainer:
    def __init__(self, actor, critic, optimizer, cfg: AlgorithmConfig = AlgorithmConfig()):
        self.actor = actor
        self.critic = critic
        self.optimizer = optimizer
        self.cfg = cfg
        self.reward_shaper = KLRewardShaper(cfg)

    def log_probs(self, model, input_ids: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
        logits = model(input_ids).logits[:, -responses.size(1) - 1 : -1]
        return torch.log_softmax(logits.float(), -1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)

    def prepare(self, batch: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        if self.cfg.use_kl_in_reward:
            rewards, _ = self.reward_shaper(
                batch["token_level_scores"], batch["old_log_probs"], batch["ref_log_probs"], batch["response_mask"]
            )
        else:
            rewards = batch["token_level_scores"]
        batch["token_level_rewards"] = rewards
        batch["advantages"], batch["returns"] = compute_gae(
            rewards, batch["values"], batch["response_mask"], self.cfg.gamma, self.cfg.lam
        )
        return batch

    def update_actor(self, batch: Dict[str, torch.Tensor]) -> float:
        n = batch["responses"].size(0)
        self.optimizer.zero_grad()
        total = 0.0
        for start in range(0, n, self.cfg.micro_batch_size):
            mb = {k: v[start : start + self.cfg.micro_batch_size] for k, v in batch.items()}
            log_probs = self.log_probs(self.actor, mb["input_ids"], mb["responses"])
            loss = ppo_loss(log_probs, mb["old_log_probs"], mb["advantages"], mb["response_mask"], self.cfg.clip_ratio)
            (loss * mb["responses"].size(0) / n).backward()
            total += loss.item()
        self.optimizer.step()
        return total
