# Part of e04 (see __init__.py). Per-token estimators of KL(pi || pi_ref).
import torch

from .registry import register_kl


@register_kl("k1")
def _kl_k1(logprobs, reference_logprobs, mask):
    # ok: KL001
    return (logprobs - reference_logprobs) * mask


@register_kl("k2")
def _kl_k2(logprobs, reference_logprobs, mask):
    log_ratio = logprobs - reference_logprobs
    return 0.5 * log_ratio.pow(2) * mask


@register_kl("k3")
def _kl_k3(logprobs, reference_logprobs, mask):
    log_ratio = (reference_logprobs - logprobs).clamp(-20.0, 20.0)
    # ok: KL002
    return (torch.exp(log_ratio) - log_ratio - 1) * mask


@register_kl("none")
def _kl_none(logprobs, reference_logprobs, mask):
    return torch.zeros_like(logprobs)
