# Part of e05 (see __init__.py).
# Verdict: bug, KL003, on the kl_rewards line of compute_kl_rewards.
import torch

from slime.utils.types import Sample

KL_COEF = 0.05


@torch.no_grad()
def compute_kl_rewards(log_probs, ref_log_probs, loss_mask, kl_coef: float = KL_COEF):
    """Per-token KL reward, zero on padding. Inputs are rollout-time log-probs."""
    # error: KL003
    kl_rewards = -kl_coef * (log_probs - ref_log_probs) * loss_mask
    return kl_rewards


@torch.no_grad()
def group_normalize(scores: torch.Tensor, n_samples_per_prompt: int, eps: float = 1e-6):
    """GRPO score normalisation within each prompt's group."""
    grouped = scores.view(-1, n_samples_per_prompt)
    mean = grouped.mean(dim=-1, keepdim=True)
    if n_samples_per_prompt == 1:
        return (grouped - mean).view(-1)
    std = grouped.std(dim=-1, keepdim=True)
    return ((grouped - mean) / (std + eps)).view(-1)


def scores_from_samples(samples: "list[Sample]") -> torch.Tensor:
    return torch.tensor([s.reward for s in samples], dtype=torch.float32)
