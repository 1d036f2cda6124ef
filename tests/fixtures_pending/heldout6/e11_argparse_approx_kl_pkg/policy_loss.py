"""Clipped policy loss with an optional KL loss term computed by the shared helper."""
import torch
import torch.nn as nn

from .kl_utils import compute_approx_kl, masked_mean


class PolicyLoss(nn.Module):
    def __init__(self, clip_eps: float = 0.2, kl_coef: float = 0.0, kl_estimator: str = "k1"):
        super().__init__()
        self.clip_eps = clip_eps
        self.kl_coef = kl_coef
        self.kl_estimator = kl_estimator

    def forward(self, log_probs, old_log_probs, base_log_probs, advantages, action_mask):
        ratio = (log_probs - old_log_probs).exp()
        surr1 = ratio * advantages
        surr2 = ratio.clamp(1 - self.clip_eps, 1 + self.clip_eps) * advantages
        loss = -torch.min(surr1, surr2)
        if self.kl_coef > 0:
            # error: KL002
            kl = compute_approx_kl(log_probs, base_log_probs, kl_estimator=self.kl_estimator)
            loss = loss + self.kl_coef * kl
        return masked_mean(loss, action_mask, dim=-1).mean()
