"""REINFORCE++-style trainer (SkyRL / verl flavour).

KL(pi || pi_ref) enters as a per-token reward, ``-kl_coef * (logp - ref)``
under ``no_grad``, added to the token-level scores; the advantage of each
token is its discounted return, and the policy loss is the clipped surrogate.
"""

from dataclasses import dataclass
from typing import Dict, Optional

import torch


@dataclass
class AlgorithmConfig:
    kl_coef: float = 0.05
    gamma: float = 1.0
    eps_clip_low: float = 0.2
    eps_clip_high: float = 0.2


@torch.no_grad()
def compute_reinforce_plus_plus_returns(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Return of every token, sum_{s >= t} gamma^(s - t) r_s, reset after the end of the response."""
    returns = torch.zeros_like(token_level_rewards)
    running_return = torch.zeros_like(token_level_rewards[:, 0])
    for t in range(token_level_rewards.shape[1]):
        running_return = token_level_rewards[:, t] + gamma * running_return
        returns[:, t] = running_return
        running_return = running_return * response_mask[:, t]
    return returns


class ReinforcePPTrainer:
    def __init__(self, policy: torch.nn.Module, optimizer: torch.optim.Optimizer, cfg: Optional[AlgorithmConfig] = None):
        self.policy = policy
        self.optimizer = optimizer
        self.cfg = cfg or AlgorithmConfig()

    @torch.no_grad()
    def compute_advantages(self, batch: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        mask = batch["response_mask"]
        # error: KL003
        kl_reward = -self.cfg.kl_coef * (batch["action_log_probs"] - batch["base_action_log_probs"]) * mask
        token_level_rewards = batch["token_level_scores"] + kl_reward
        batch["advantages"] = compute_reinforce_plus_plus_returns(token_level_rewards, mask, self.cfg.gamma)
        return batch

    def policy_loss(self, logits: torch.Tensor, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        mask = batch["response_mask"]
        log_probs = torch.log_softmax(logits, dim=-1).gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
        ratio = torch.exp(log_probs - batch["action_log_probs"])
        advantages = batch["advantages"]
        surr1 = ratio * advantages
        surr2 = ratio.clamp(1.0 - self.cfg.eps_clip_low, 1.0 + self.cfg.eps_clip_high) * advantages
        return (-torch.min(surr1, surr2) * mask).sum(dim=-1).mean()

    def train_step(self, batch: Dict[str, torch.Tensor]) -> float:
        batch = self.compute_advantages(batch)
        response_length = batch["responses"].size(1)
        logits = self.policy(batch["input_ids"]).logits[:, -response_length - 1 : -1]
        loss = self.policy_loss(logits, batch)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.item()
