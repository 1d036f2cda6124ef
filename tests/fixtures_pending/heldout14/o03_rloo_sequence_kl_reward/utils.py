import torch.nn.functional as F


def log_probs_from_logits(logits, labels, temperature=1.0):
    log_probs = F.log_softmax(logits / temperature, dim=-1)
    return log_probs.gather(dim=-1, index=labels.unsqueeze(-1)).squeeze(-1)


def masked_mean(tensor, mask, dim=None):
    return (tensor * mask).sum(dim=dim) / mask.sum(dim=dim).clamp(min=1)


def compute_approx_kl(log_probs, log_probs_base, kl_estimator="k1"):
    """Schulman's estimators of KL(actor || initial model), per token."""
    log_ratio = log_probs.float() - log_probs_base.float()
    if kl_estimator == "k2":
        log_ratio = log_ratio**2 / 2.0
    elif kl_estimator == "k3":
        log_ratio = -log_ratio
        log_ratio = log_ratio.exp() - 1 - log_ratio
    return log_ratio
