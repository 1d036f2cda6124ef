"""PPO-style trainer (SkyRL / verl flavour) with a distributional critic.

KL(pi || pi_ref) enters as a per-token reward, ``-kl_coef * (logp - ref)``
under ``no_grad``, added to the token-level scores; each token's advantage is
its discounted return minus the critic's expected value of the state before
it. The critic predicts a histogram over return bins (HL-Gauss) and is
trained with the cross-entropy to the smoothed target, written as the KL from
the target histogram to the critic's.
"""

import math
from dataclasses import dataclass
from typing import Dict, Optional

import torch


@dataclass
class AlgorithmConfig:
    kl_coef: float = 0.05
    gamma: float = 1.0
    eps_clip_low: float = 0.2
    eps_clip_high: float = 0.2
    vf_coef: float = 0.5


@dataclass
class CriticConfig:
    num_bins: int = 11
    v_min: float = -1.0
    v_max: float = 1.0
    sigma_ratio: float = 0.75


def bin_centers(cfg: CriticConfig) -> torch.Tensor:
    edges = torch.linspace(cfg.v_min, cfg.v_max, cfg.num_bins + 1, dtype=torch.get_default_dtype())
    return 0.5 * (edges[1:] + edges[:-1])


def hl_gauss_target(returns: torch.Tensor, cfg: CriticConfig) -> torch.Tensor:
    edges = torch.linspace(cfg.v_min, cfg.v_max, cfg.num_bins + 1, dtype=returns.dtype)
    sigma = cfg.sigma_ratio * (edges[1] - edges[0])
    cdf = 0.5 * (1.0 + torch.erf((edges - returns.unsqueeze(-1)) / (sigma * math.sqrt(2.0))))
    probs = cdf[..., 1:] - cdf[..., :-1]
    return probs / probs.sum(dim=-1, keepdim=True).clamp_min(1e-8)


def distributional_value_loss(value_logits: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, cfg: CriticConfig) -> torch.Tensor:
    target_probs = hl_gauss_target(returns.detach(), cfg)
    value_log_probs = torch.log_softmax(value_logits, dim=-1)
    # ok: KL001, KL002, KL003, KL005
    per_token = (target_probs * (torch.log(target_probs.clamp_min(1e-12)) - value_log_probs)).sum(dim=-1)
    return (per_token * mask).sum() / mask.sum().clamp(min=1)


@torch.no_grad()
def compute_reinforce_plus_plus_returns(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Return of every token, sum_{s >= t} gamma^(s - t) r_s, reset after the end of the response."""
    returns = torch.zeros_like(token_level_rewards)
    running_return = torch.zeros_like(token_level_rewards[:, 0])
    for t in reversed(range(token_level_rewards.shape[1])):
        running_return = token_level_rewards[:, t] + gamma * running_return
        returns[:, t] = running_return
        running_return = running_return * response_mask[:, t]
    return returns


class PPOTrainer:
    def __init__(
        self,
        policy: torch.nn.Module,
        critic: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        cfg: Optional[AlgorithmConfig] = None,
        critic_cfg: Optional[CriticConfig] = None,
    ):
        self.policy = policy
        self.critic = critic
        self.optimizer = optimizer
        self.cfg = cfg or AlgorithmConfig()
        self.critic_cfg = critic_cfg or CriticConfig()

    @torch.no_grad()
    def compute_advantages(self, batch: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        mask = batch["response_mask"]
        response_length = batch["responses"].size(1)
        # ok: KL001, KL003
        kl_reward = -self.cfg.kl_coef * (batch["action_log_probs"] - batch["base_action_log_probs"]) * mask
        token_level_rewards = batch["token_level_scores"] + kl_reward
        returns = compute_reinforce_plus_plus_returns(token_level_rewards, mask, self.cfg.gamma)
        value_logits = self.critic(batch["input_ids"]).logits[:, -response_length - 1 : -1]
        values = (torch.softmax(value_logits, dim=-1) * bin_centers(self.critic_cfg)).sum(dim=-1)
        batch["returns"] = returns
        batch["advantages"] = (returns - values) * mask
        return batch

    def loss(self, logits: torch.Tensor, value_logits: torch.Tensor, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        mask = batch["response_mask"]
        log_probs = torch.log_softmax(logits, dim=-1).gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
        ratio = torch.exp(log_probs - batch["action_log_probs"])
        advantages = batch["advantages"]
        surr1 = ratio * advantages
        surr2 = ratio.clamp(1.0 - self.cfg.eps_clip_low, 1.0 + self.cfg.eps_clip_high) * advantages
        policy_loss = (-torch.min(surr1, surr2) * mask).sum(dim=-1).mean()
        value_loss = distributional_value_loss(value_logits, batch["returns"], mask, self.critic_cfg)
        return policy_loss + self.cfg.vf_coef * value_loss

    def train_step(self, batch: Dict[str, torch.Tensor]) -> float:
        batch = self.compute_advantages(batch)
        response_length = batch["responses"].size(1)
        logits = self.policy(batch["input_ids"]).logits[:, -response_length - 1 : -1]
        value_logits = self.critic(batch["input_ids"]).logits[:, -response_length - 1 : -1]
        loss = self.loss(logits, value_logits, batch)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.item()
