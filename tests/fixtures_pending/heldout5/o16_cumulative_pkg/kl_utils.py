import torch


def reverse_cumsum(x, dim=-1):
    return x.flip(dim).cumsum(dim).flip(dim)


def kl_to_go(logp, ref_logp, mask):
    with torch.no_grad():
        log_ratio = (logp - ref_logp) * mask
        return reverse_cumsum(log_ratio)


def policy_logprobs(model, ids, n):
    logits = model(ids).logits[:, -n - 1 : -1]
    return torch.log_softmax(logits, -1).gather(-1, ids[:, -n:].unsqueeze(-1)).squeeze(-1)
