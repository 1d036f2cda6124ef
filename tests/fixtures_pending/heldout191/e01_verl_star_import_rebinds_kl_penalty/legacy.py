# Reviewer: the 0.2 helpers, kept for old recipes. No __all__: a star import
# exports every public name here, kl_penalty included.
"""Deprecated helpers. Import from the package root instead."""
import warnings

import torch


def compute_grad_norm(parameters) -> float:
    total = 0.0
    for p in parameters:
        if p.grad is not None:
            total += float(p.grad.detach().pow(2).sum())
    return total**0.5


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, response_mask=None) -> torch.Tensor:
    """0.2 behaviour: the per-token log-ratio (`kl_penalty="kl"`)."""
    kl = logprob - ref_logprob
    if response_mask is not None:
        kl = kl * response_mask
    return kl


def compute_policy_loss_legacy(old_log_prob, log_prob, advantages, eos_mask, cliprange=0.2):
    warnings.warn("use DataParallelPPOActor.compute_policy_loss", DeprecationWarning, stacklevel=2)
    ratio = torch.exp(log_prob - old_log_prob)
    pg_losses = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(1 - cliprange, 1 + cliprange))
    return (pg_losses * eos_mask).sum() / eos_mask.sum()
