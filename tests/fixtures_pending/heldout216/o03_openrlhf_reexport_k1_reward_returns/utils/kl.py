"""KL estimators and the in-reward KL penalty."""

from typing import Optional

import torch


def compute_approx_kl(
    log_probs: torch.Tensor,
    log_probs_base: torch.Tensor,
    kl_estimator: str = "k1",
) -> torch.Tensor:
    """Per-token approximate KL between the actor and the initial (reference) model."""
    if kl_estimator == "k1":
        log_ratio = log_probs.float() - log_probs_base.float()
    elif kl_estimator == "k2":
        log_ratio = log_probs.float() - log_probs_base.float()
        log_ratio = log_ratio**2 / 2.0
    elif kl_estimator == "k3":
        log_ratio = log_probs.float() - log_probs_base.float()
        log_ratio = -log_ratio
        log_ratio = log_ratio.exp() - 1 - log_ratio
    else:
        raise ValueError(f"Unknown kl_estimator {kl_estimator}")
    return log_ratio


def compute_reward(r: torch.Tensor, kl_coef: float, kl: torch.Tensor, action_mask: Optional[torch.Tensor] = None):
    """Token rewards: -kl_coef * kl everywhere, plus the score on the last action."""
    kl_reward = -kl_coef * kl
    eos_indices = action_mask.size(1) - 1 - action_mask.long().fliplr().argmax(dim=1, keepdim=True)
    last_reward = torch.zeros_like(kl).scatter_(dim=1, index=eos_indices, src=r.unsqueeze(1).to(kl.dtype))
    return (last_reward + kl_reward) * action_mask
