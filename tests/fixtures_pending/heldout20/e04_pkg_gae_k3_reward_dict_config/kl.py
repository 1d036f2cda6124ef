"""KL estimators and the KL-shaped token reward (OpenRLHF ``models/utils.py`` style)."""

import torch


def compute_approx_kl(log_probs: torch.Tensor, log_probs_base: torch.Tensor, kl_estimator: str = "k1") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_base) (Schulman's k1, k2, k3)."""
    if kl_estimator == "k1":
        log_ratio = log_probs - log_probs_base

    if kl_estimator == "k2":
        log_ratio = log_probs - log_probs_base
        log_ratio = log_ratio**2 / 2.0

    if kl_estimator == "k3":
        log_ratio = log_probs - log_probs_base
        log_ratio = -log_ratio
        log_ratio = log_ratio.exp() - 1 - log_ratio

    log_ratio = log_ratio.clamp(min=-10, max=10)
    return log_ratio


def compute_reward(r: torch.Tensor, kl_coef: float, kl: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """Token rewards: -kl_coef * kl on every action, the task score on the last one."""
    kl_reward = -kl_coef * kl
    eos_indices = action_mask.size(1) - 1 - action_mask.long().fliplr().argmax(dim=1, keepdim=True)
    last_reward = torch.zeros_like(kl).scatter_(dim=1, index=eos_indices, src=r.unsqueeze(1).to(kl.dtype))
    return last_reward + kl_reward
