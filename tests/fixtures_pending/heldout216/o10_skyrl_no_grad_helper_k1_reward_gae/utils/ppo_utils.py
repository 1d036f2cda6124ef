"""PPO utilities: KL estimates and loss reduction."""

import torch

from .torch_functional import masked_sum


@torch.no_grad()
def compute_approx_kl(log_probs, log_probs_base, loss_mask=None, kl_estimator_type="k3"):
    """Per-token estimate of KL(pi || pi_ref) ("k1", "k2", "k3"/"low_var_kl")."""
    log_ratio = log_probs - log_probs_base
    if kl_estimator_type == "k1":
        kl = log_ratio
    elif kl_estimator_type == "k2":
        kl = 0.5 * log_ratio.square()
    elif kl_estimator_type in ("k3", "low_var_kl"):
        kl = torch.exp(-log_ratio) - 1 + log_ratio
    else:
        raise ValueError(kl_estimator_type)
    if loss_mask is not None:
        kl = kl * loss_mask
    return kl


def reduce_loss(loss, loss_mask, loss_reduction="seq_mean_token_sum"):
    if loss_reduction == "seq_mean_token_sum":
        return masked_sum(loss, loss_mask, dim=-1).mean()
    if loss_reduction == "token_mean":
        return masked_sum(loss, loss_mask) / loss_mask.sum().clamp(min=1)
    raise ValueError(loss_reduction)
