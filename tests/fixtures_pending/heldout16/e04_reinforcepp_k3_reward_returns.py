"""REINFORCE++-baseline experience maker (OpenRLHF style): the KL penalty is
put in the per-token rewards with the estimator read from a config dataclass
into ``self.kl_estimator`` (default ``"k3"``), returns by a reverse loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def compute_approx_kl(log_probs, log_probs_base, kl_estimator="k1"):
    log_ratio = log_probs - log_probs_base
    if kl_estimator == "k1":
        return log_ratio
    if kl_estimator == "k2":
        return log_ratio**2 / 2.0
    if kl_estimator == "k3":
        log_ratio = -log_ratio
        return log_ratio.exp() - 1 - log_ratio
    raise ValueError(kl_estimator)


def compute_reward(r, kl_coef, kl, action_mask):
    kl_reward = -kl_coef * kl
    eos_indices = action_mask.size(1) - 1 - action_mask.long().fliplr().argmax(dim=1, keepdim=True)
    last_reward = torch.zeros_like(kl).scatter_(dim=1, index=eos_indices, src=r.unsqueeze(1).to(kl.dtype))
    return last_reward + kl_reward


def get_cumulative_returns(rewards, action_mask, gamma=1.0):
    returns = torch.zeros_like(rewards)
    cumulative_return = torch.zeros(rewards.size(0), dtype=rewards.dtype, device=rewards.device)
    rewards = action_mask * rewards
    for t in reversed(range(rewards.size(1))):
        cumulative_return = rewards[:, t] + gamma * cumulative_return
        returns[:, t] = cumulative_return
    return returns


class FixedKLController:
    def __init__(self, kl_coef):
        self.value = kl_coef


@dataclass
class RewardConfig:
    kl_estimator: str = "k3"
    init_kl_coef: float = 0.01
    gamma: float = 1.0
    n_samples_per_prompt: int = 1


class ExperienceMaker:
    def __init__(self, cfg: RewardConfig | None = None):
        self.cfg = cfg or RewardConfig()
        self.kl_estimator = self.cfg.kl_estimator
        self.kl_ctl = FixedKLController(self.cfg.init_kl_coef)

    @torch.no_grad()
    def make_experience(self, action_log_probs, base_action_log_probs, scores, action_mask):
        n = self.cfg.n_samples_per_prompt
        grouped = scores.view(-1, n)
        scores = (grouped - grouped.mean(-1, keepdim=True)).view(-1)
        # error: KL004
        kl = compute_approx_kl(action_log_probs, base_action_log_probs, kl_estimator=self.kl_estimator)
        rewards = compute_reward(scores, self.kl_ctl.value, kl, action_mask)
        returns = get_cumulative_returns(rewards, action_mask, self.cfg.gamma)
        return {"returns": returns, "action_mask": action_mask}


def reinforce_loss(log_probs, returns, action_mask):
    return -(returns * log_probs * action_mask).sum(-1).mean()


def train_step(maker, actor, sequences, base_action_log_probs, scores, action_mask):
    with torch.no_grad():
        rollout_log_probs = actor(sequences)
    experience = maker.make_experience(rollout_log_probs, base_action_log_probs, scores, action_mask)
    log_probs = actor(sequences)
    loss = reinforce_loss(log_probs, experience["returns"], experience["action_mask"])
    loss.backward()
    return loss.detach()
