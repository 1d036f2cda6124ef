"""REINFORCE++: token-level KL reward, discounted returns, global batch whitening."""
from dataclasses import dataclass
from typing import Dict, Optional

import torch


@dataclass
class Experience:
    sequences: torch.Tensor
    action_log_probs: torch.Tensor
    advantages: torch.Tensor
    action_mask: torch.Tensor
    info: Dict[str, torch.Tensor]


def compute_reward(r: torch.Tensor, kl_coef: float, kl: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """Place the sequence reward on the last action and the KL term on every action."""
    kl_reward = kl_coef * kl
    eos_indices = action_mask.size(1) - 1 - action_mask.long().fliplr().argmax(dim=1, keepdim=True)
    last_reward = torch.zeros_like(kl).scatter_(dim=1, index=eos_indices, src=r.unsqueeze(1).to(kl.dtype))
    return last_reward + kl_reward


def get_cumulative_returns(rewards: torch.Tensor, action_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    returns = torch.zeros_like(rewards)
    running = torch.zeros(rewards.size(0), dtype=rewards.dtype)
    for t in reversed(range(rewards.size(1))):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
    return returns * action_mask


def whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    mean = x[mask.bool()].mean()
    std = x[mask.bool()].std().clamp(min=eps)
    return (x - mean) / std * mask


class ReinforcePPTrainer:
    def __init__(self, actor, initial_model, reward_model, init_kl_coef: float = 0.01, gamma: float = 1.0, micro_batch_size: int = 9):
        self.actor = actor
        self.initial_model = initial_model
        self.reward_model = reward_model
        self.kl_coef = init_kl_coef
        self.gamma = gamma
        self.micro_batch_size = micro_batch_size

    def _action_log_probs(self, model, sequences: torch.Tensor, num_actions: int) -> torch.Tensor:
        logits = model(sequences).logits[:, :-1]
        lp = logits.log_softmax(-1).gather(-1, sequences[:, 1:].unsqueeze(-1)).squeeze(-1)
        return lp[:, -num_actions:]

    @torch.no_grad()
    def make_experience(self, sequences: torch.Tensor, action_mask: torch.Tensor) -> Experience:
        num_actions = action_mask.size(1)
        pi_lp = self._action_log_probs(self.actor, sequences, num_actions)
        init_lp = self._action_log_probs(self.initial_model, sequences, num_actions)
        r = self.reward_model(sequences)
        # error: KL006
        kl = (pi_lp - init_lp) * action_mask
        rewards = compute_reward(r, self.kl_coef, kl, action_mask)
        returns = get_cumulative_returns(rewards, action_mask, self.gamma)
        advantages = whiten(returns, action_mask)
        info = {"kl": (kl.sum(-1) / action_mask.sum(-1)).mean(), "reward": r.mean()}
        return Experience(sequences, pi_lp, advantages, action_mask, info)

    def policy_loss(self, log_probs, old_log_probs, advantages, action_mask, clip_eps: float = 0.2) -> torch.Tensor:
        ratio = (log_probs - old_log_probs).exp()
        surr1 = ratio * advantages
        surr2 = ratio.clamp(1 - clip_eps, 1 + clip_eps) * advantages
        loss = -torch.min(surr1, surr2)
        return ((loss * action_mask).sum(-1) / action_mask.sum(-1)).mean()

    def training_step(self, exp: Experience, optimizer: Optional[torch.optim.Optimizer] = None) -> float:
        n = exp.sequences.size(0)
        num_actions = exp.action_mask.size(1)
        total = 0.0
        for start in range(0, n, self.micro_batch_size):
            sl = slice(start, start + self.micro_batch_size)
            log_probs = self._action_log_probs(self.actor, exp.sequences[sl], num_actions)
            loss = self.policy_loss(log_probs, exp.action_log_probs[sl], exp.advantages[sl], exp.action_mask[sl])
            loss = loss * log_probs.size(0) / n
            loss.backward()
            total += loss.item()
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad()
        return total
