# Reviewer: each function returns one KL(pi||pi_ref) estimate per response, [B]; none
# is a loss by itself (the worker decides).
"""Registered KL estimators."""

import torch

from .registry import register_kl


@register_kl("k1", "kl")
def kl_k1(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return ((log_probs - ref_log_probs) * mask).sum(dim=-1)


@register_kl("k3", "low_var_kl")
def kl_low_var(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    log_ratio = (ref_log_probs - log_probs).clamp(min=-20.0, max=20.0)
    kl = log_ratio.exp() - log_ratio - 1
    return (kl * mask).sum(dim=-1)


@register_kl("seq_mse")
def kl_seq_mse(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    seq_log_ratio = ((log_probs - ref_log_probs) * mask).sum(dim=-1)
    return 0.5 * seq_log_ratio.square()
