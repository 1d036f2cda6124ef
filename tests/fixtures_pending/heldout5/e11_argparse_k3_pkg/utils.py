import torch


def compute_approx_kl(log_probs, log_probs_base, kl_estimator="k1"):
    if kl_estimator == "k1":
        log_ratio = log_probs.float() - log_probs_base.float()
    elif kl_estimator == "k2":
        log_ratio = log_probs.float() - log_probs_base.float()
        log_ratio = log_ratio**2 / 2.0
    elif kl_estimator == "k3":
        log_ratio = log_probs.float() - log_probs_base.float()
        log_ratio = -log_ratio
        log_ratio = log_ratio.exp() - 1 - log_ratio
    else:
        raise ValueError(kl_estimator)
    return log_ratio.clamp(min=-10, max=10)


def masked_mean(tensor, mask, dim=None):
    if dim is None:
        return (tensor * mask).sum() / mask.sum()
    return (tensor * mask).sum(dim) / mask.sum(dim)


def action_log_probs(model, sequences, num_actions, attention_mask):
    logits = model(sequences, attention_mask=attention_mask).logits[:, :-1]
    lp = torch.log_softmax(logits, dim=-1)
    lp = lp.gather(-1, sequences[:, 1:].unsqueeze(-1)).squeeze(-1)
    return lp[:, -num_actions:]
