# Part of o08 (see __init__.py). Per-token estimators of KL(pi || pi_ref).
import torch


def compute_approx_kl(log_probs, log_probs_base, loss_mask=None, kl_estimator_type: str = "k3"):
    if kl_estimator_type == "k1":
        kld = log_probs - log_probs_base
    elif kl_estimator_type == "abs":
        kld = (log_probs - log_probs_base).abs()
    elif kl_estimator_type == "k2":
        kld = 0.5 * (log_probs - log_probs_base).square()
    elif kl_estimator_type == "k3":
        log_ratio = log_probs_base - log_probs
        kld = torch.exp(log_ratio) - log_ratio - 1
    else:
        raise ValueError(kl_estimator_type)
    if loss_mask is not None:
        kld = kld * loss_mask
    return kld


def reduce_loss(values, loss_mask, loss_reduction: str):
    if loss_reduction == "sequence_sum":
        return (values * loss_mask).sum(-1).mean()
    if loss_reduction == "token_mean":
        return (values * loss_mask).sum() / loss_mask.sum().clamp(min=1)
    raise ValueError(loss_reduction)
