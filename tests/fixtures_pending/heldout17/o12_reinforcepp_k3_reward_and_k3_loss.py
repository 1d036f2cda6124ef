"""REINFORCE++-style trainer that applies the k3 KL both in the reward and in the loss.

With ``add_kl_to_reward`` and ``add_kl_to_loss`` both on (the defaults) and
one coefficient for both, the per-token k3 reward credited by returns
(gamma = 1) and the per-token k3 loss together have the expected gradient of
the sequence KL(pi || pi_ref): the loss half supplies exactly the part of the
gradient that a k3 reward lacks.
"""

from dataclasses import dataclass
from typing import Dict

import torch


@dataclass
class KLConfig:
    kl_coef: float = 0.01
    kl_estimator: str = "k3"
    add_kl_to_reward: bool = True
    add_kl_to_loss: bool = True
    gamma: float = 1.0
    eps_clip: float = 0.2


def compute_approx_kl(log_probs: torch.Tensor, log_probs_base: torch.Tensor, kl_estimator: str = "k1") -> torch.Tensor:
    log_ratio = log_probs.float() - log_probs_base.float()
    if kl_estimator == "k1":
        return log_ratio
    if kl_estimator == "k2":
        return log_ratio**2 / 2.0
    if kl_estimator == "k3":
        log_ratio = -log_ratio
        return log_ratio.exp() - 1 - log_ratio
    raise ValueError(kl_estimator)


def get_cumulative_returns(rewards: torch.Tensor, action_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    returns = torch.zeros_like(rewards)
    cumulative_return = torch.zeros(rewards.size(0), device=rewards.device, dtype=rewards.dtype)
    rewards = rewards * action_mask
    for t in reversed(range(rewards.size(1))):
        cumulative_return = rewards[:, t] + gamma * cumulative_return
        returns[:, t] = cumulative_return
    return returns


class ReinforcePlusPlusTrainer:
    def __init__(self, actor, optimizer, cfg: KLConfig = KLConfig()):
        self.actor = actor
        self.optimizer = optimizer
        self.cfg = cfg

    @torch.no_grad()
    def make_experience(
        self,
        scores: torch.Tensor,
        action_log_probs: torch.Tensor,
        base_action_log_probs: torch.Tensor,
        action_mask: torch.Tensor,
    ) -> Dict[str, torch.Tensor]:
        rewards = torch.zeros_like(action_log_probs)
        eos_indices = action_mask.sum(dim=1).long() - 1
        rewards[torch.arange(rewards.size(0)), eos_indices] = scores
        if self.cfg.add_kl_to_reward:
            # ok: KL002, KL004, KL006
            kl = compute_approx_kl(action_log_probs, base_action_log_probs, kl_estimator=self.cfg.kl_estimator)
            rewards = rewards - self.cfg.kl_coef * kl * action_mask
        returns = get_cumulative_returns(rewards, action_mask, self.cfg.gamma)
        return {
            "action_log_probs": action_log_probs,
            "base_action_log_probs": base_action_log_probs,
            "advantages": returns,
            "action_mask": action_mask,
        }

    def actor_loss(
        self,
        log_probs: torch.Tensor,
        old_log_probs: torch.Tensor,
        base_log_probs: torch.Tensor,
        advantages: torch.Tensor,
        action_mask: torch.Tensor,
    ) -> torch.Tensor:
        ratio = (log_probs - old_log_probs).exp()
        surr1 = ratio * advantages
        surr2 = ratio.clamp(1 - self.cfg.eps_clip, 1 + self.cfg.eps_clip) * advantages
        loss = -torch.min(surr1, surr2)
        if self.cfg.add_kl_to_loss:
            # ok: KL002, KL004
            kl = compute_approx_kl(log_probs, base_log_probs, kl_estimator=self.cfg.kl_estimator)
            loss = loss + self.cfg.kl_coef * kl
        return (loss * action_mask).sum(-1).mean()

    def training_step(self, experience: Dict[str, torch.Tensor], sequences: torch.Tensor) -> float:
        num_actions = experience["action_mask"].size(1)
        logits = self.actor(sequences).logits[:, -num_actions - 1 : -1]
        log_probs = torch.log_softmax(logits.float(), -1).gather(-1, sequences[:, -num_actions:].unsqueeze(-1)).squeeze(-1)
        loss = self.actor_loss(
            log_probs,
            experience["action_log_probs"],
            experience["base_action_log_probs"],
            experience["advantages"],
            experience["action_mask"],
        )
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.item()
