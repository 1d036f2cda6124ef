"""Reward side: the KL mode is a string, "both" by default."""
from dataclasses import dataclass

import torch

from .kl import low_var_kl


@dataclass
class PipelineConfig:
    kl_mode: str = "both"  # "none" | "reward" | "loss" | "both"
    kl_coef: float = 0.1


@torch.no_grad()
def compute_sequence_rewards(cfg: PipelineConfig, scores, log_probs, ref_log_probs, response_mask):
    rewards = scores.clone()
    if cfg.kl_mode in ("reward", "both"):
        # ok: KL004
        kl = low_var_kl(log_probs, ref_log_probs) * response_mask
        rewards = rewards - cfg.kl_coef * kl.sum(-1)
    return rewards
