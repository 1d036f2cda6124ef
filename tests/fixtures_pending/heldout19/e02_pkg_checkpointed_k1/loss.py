"""PPO actor loss with a KL-to-reference term, recomputed under activation checkpointing."""

import torch
from torch.utils.checkpoint import checkpoint

from .estimators import approx_kl
from .reduce import batch_mean, masked_mean


class ActorLoss:
    def __init__(self, clip_eps: float = 0.2, kl_coef: float = 0.01, kl_estimator: str = "k1"):
        self.clip_eps = clip_eps
        self.kl_coef = kl_coef
        self.kl_estimator = kl_estimator

    def __call__(self, log_probs, old_log_probs, ref_log_probs, advantages, action_mask):
        ratio = (log_probs - old_log_probs).exp()
        surr1 = ratio * advantages
        surr2 = ratio.clamp(1 - self.clip_eps, 1 + self.clip_eps) * advantages
        pg = -torch.min(surr1, surr2)
        # error: KL001
        kl = checkpoint(approx_kl, log_probs, ref_log_probs, self.kl_estimator, use_reentrant=False)
        per_seq = masked_mean(pg + self.kl_coef * kl, action_mask, dim=-1)
        return batch_mean(per_seq)
