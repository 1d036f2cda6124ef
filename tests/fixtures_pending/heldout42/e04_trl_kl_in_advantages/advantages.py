# Reviewer: part of e04_trl_kl_in_advantages (see __init__.py): subtracts the per-token k1 from
# the advantages, no reward-to-go (KL003 at the call).
"""Advantage estimation with a per-token KL penalty."""

from dataclasses import dataclass

import torch

from .kl import estimate_kl


@dataclass
class AdvantageConfig:
    gamma: float = 1.0
    lam: float = 0.95
    kl_coef: float = 0.05
    whiten_advantages: bool = False


def masked_whiten(values, mask, shift_mean=True):
    mean = (values * mask).sum() / mask.sum()
    var = ((values - mean) ** 2 * mask).sum() / mask.sum()
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    return whitened if shift_mean else whitened + mean


def compute_advantages(scores, values, logprobs, ref_logprobs, response_mask, cfg: AdvantageConfig):
    """GAE on the task reward, then the KL penalty applied to each token's advantage."""
    with torch.no_grad():
        bsz, gen_len = response_mask.shape
        sequence_lengths = response_mask.sum(dim=1).long() - 1
        rewards = torch.zeros_like(response_mask)
        rewards[torch.arange(bsz), sequence_lengths] = scores
        values = values * response_mask  # padded value-head outputs are garbage

        lastgaelam = torch.zeros(bsz)
        advantages_reversed = []
        for t in reversed(range(gen_len)):
            nextvalues = values[:, t + 1] * response_mask[:, t + 1] if t < gen_len - 1 else 0.0
            delta = rewards[:, t] + cfg.gamma * nextvalues - values[:, t]
            lastgaelam = delta + cfg.gamma * cfg.lam * lastgaelam
            advantages_reversed.append(lastgaelam)
        advantages = torch.stack(advantages_reversed[::-1], dim=1) * response_mask
        returns = advantages + values

        # error: KL003
        kl = estimate_kl(logprobs, ref_logprobs, kind="k1")
        advantages = advantages - cfg.kl_coef * kl * response_mask
        if cfg.whiten_advantages:
            advantages = masked_whiten(advantages, response_mask)
        advantages = advantages * response_mask
    return advantages, returns, (kl * response_mask).sum(1).mean()
