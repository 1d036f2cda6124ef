"""Token-level helpers."""

import torch
import torch.nn.functional as F

__all__ = ["logprobs_from_logits", "masked_mean", "masked_sum", "reverse_cumsum", "entropy_from_logits"]


def logprobs_from_logits(logits, labels):
    return F.log_softmax(logits, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits):
    logp = F.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def masked_sum(x, mask, dim=-1):
    return (x * mask).sum(dim)


def masked_mean(x, mask, dim=-1):
    return masked_sum(x, mask, dim) / mask.sum(dim).clamp(min=1)


def reverse_cumsum(x, mask):
    """sum_{s >= t} x_s over valid positions (a reward-to-go, gamma = 1)."""
    return torch.flip(torch.cumsum(torch.flip(x * mask, [-1]), -1), [-1]) * mask
