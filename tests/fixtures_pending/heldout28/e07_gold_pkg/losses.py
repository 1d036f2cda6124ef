import torch


def kl_penalty(logprob, ref_logprob, kind="kl"):
    """Per-token estimate of KL(student || teacher) on sampled tokens."""
    if kind == "kl":
        return logprob - ref_logprob
    if kind == "abs":
        return (logprob - ref_logprob).abs()
    if kind == "mse":
        return 0.5 * (logprob - ref_logprob).square()
    if kind == "low_var_kl":
        kl = ref_logprob - logprob
        ratio = torch.exp(kl)
        return (ratio - kl - 1).contiguous()
    raise NotImplementedError(kind)


def masked_mean(values, mask):
    return (values * mask).sum() / mask.sum().clamp(min=1.0)
