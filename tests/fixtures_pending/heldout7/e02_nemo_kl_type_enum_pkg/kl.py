"""KL estimators between per-token log-probs of the policy and of a reference policy."""

from __future__ import annotations

import enum
from typing import Optional

import torch


class KLType(str, enum.Enum):
    K1 = "k1"
    K2 = "k2"
    K3 = "k3"


def masked_mean(
    values: torch.Tensor,
    mask: torch.Tensor,
    dim: Optional[int] = None,
    global_normalization_factor: Optional[torch.Tensor | float] = None,
) -> torch.Tensor:
    normalization_factor = (
        torch.sum(mask, dim=dim) if global_normalization_factor is None else global_normalization_factor
    )
    return torch.sum(values * mask, dim=dim) / (normalization_factor + 1e-8)


def calculate_kl(
    logprobs: torch.Tensor,
    logprobs_reference: torch.Tensor,
    kl_type: KLType | str = KLType.K3,
    input_clamp_value: Optional[float] = 20.0,
) -> torch.Tensor:
    """Per-token estimate of KL(pi||pi_ref) (Schulman, "Approximating KL divergence")."""
    kl_type = KLType(kl_type)
    logr = logprobs_reference - logprobs
    if input_clamp_value is not None:
        logr = logr.clamp(min=-input_clamp_value, max=input_clamp_value)
    if kl_type is KLType.K1:
        return -logr
    if kl_type is KLType.K2:
        return 0.5 * logr.square()
    return torch.exp(logr) - 1 - logr
