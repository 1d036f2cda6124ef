from typing import Optional

import torch


def compute_approx_kl(log_probs, log_probs_base, action_mask: Optional[torch.Tensor] = None, kl_estimator: str = "k1"):
    log_ratio = log_probs.float() - log_probs_base.float()
    if kl_estimator == "k2":
        log_ratio = log_ratio**2 / 2.0
    elif kl_estimator == "k3":
        log_ratio = (-log_ratio).exp() - 1 + log_ratio
    elif kl_estimator != "k1":
        raise ValueError(kl_estimator)
    if action_mask is not None:
        log_ratio = log_ratio * action_mask
    return log_ratio


def compute_reward(r, kl_coef, log_probs, ref_log_probs, action_mask, kl_estimator="k1"):
    """Dense per-token rewards: -kl_coef * KL at every token, the sequence reward on the last one."""
    # error: KL004
    kl = compute_approx_kl(log_probs, ref_log_probs, action_mask, kl_estimator=kl_estimator)
    kl_reward = -kl_coef * kl
    eos_indices = action_mask.size(1) - 1 - action_mask.long().fliplr().argmax(dim=1, keepdim=True)
    last_reward = torch.zeros_like(kl).scatter_(dim=1, index=eos_indices, src=r.unsqueeze(1).to(kl.dtype))
    return last_reward + kl_reward, kl


def get_cumulative_returns(rewards: torch.Tensor, action_mask: torch.Tensor, gamma: float):
    returns = torch.zeros_like(rewards)
    cumulative = torch.zeros(rewards.size(0), dtype=rewards.dtype, device=rewards.device)
    rewards = rewards * action_mask
    for t in reversed(range(rewards.size(1))):
        cumulative = rewards[:, t] + gamma * cumulative
        returns[:, t] = cumulative
    return returns
