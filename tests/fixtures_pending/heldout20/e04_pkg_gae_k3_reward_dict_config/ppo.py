"""Clipped PPO policy loss and the actor's training step."""

from typing import Dict

import torch
from torch import nn

from .experience import action_log_probs


class PolicyLoss(nn.Module):
    def __init__(self, clip_eps: float = 0.2):
        super().__init__()
        self.clip_eps = clip_eps

    def forward(self, log_probs, old_log_probs, advantages, action_mask):
        ratio = (log_probs - old_log_probs).exp()
        surr1 = ratio * advantages
        surr2 = ratio.clamp(1 - self.clip_eps, 1 + self.clip_eps) * advantages
        loss = -torch.min(surr1, surr2)
        return ((loss * action_mask).sum(-1) / action_mask.sum(-1).clamp(min=1)).mean()


def actor_loss(actor, policy_loss_fn: PolicyLoss, experience: Dict[str, torch.Tensor]) -> torch.Tensor:
    num_actions = experience["action_mask"].size(1)
    log_probs = action_log_probs(actor, experience["sequences"], num_actions, experience["attention_mask"])
    return policy_loss_fn(log_probs, experience["action_log_probs"], experience["advantages"], experience["action_mask"])


def ppo_train_step(actor, optimizer, policy_loss_fn: PolicyLoss, experience: Dict[str, torch.Tensor]) -> float:
    loss = actor_loss(actor, policy_loss_fn, experience)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()
