# Part of e05 (see __init__.py). Token-level advantages.
import torch


@torch.no_grad()
def compute_token_advantages(kl_rewards, scores, loss_mask, n_samples_per_prompt: int = 1, normalize: bool = False):
    """Advantage of each token: its own shaped reward plus the sequence score.

    The sequence score is broadcast over the response tokens (outcome reward);
    the KL reward is per token ("dense" shaping).
    """
    from .rewards import group_normalize

    if normalize:
        scores = group_normalize(scores, n_samples_per_prompt)
    advantages = kl_rewards + scores.unsqueeze(-1) * loss_mask
    return advantages * loss_mask


@torch.no_grad()
def advantage_stats(advantages, loss_mask):
    n = loss_mask.sum().clamp(min=1)
    mean = (advantages * loss_mask).sum() / n
    var = ((advantages - mean) ** 2 * loss_mask).sum() / n
    return {"adv/mean": mean.item(), "adv/std": var.sqrt().item()}
