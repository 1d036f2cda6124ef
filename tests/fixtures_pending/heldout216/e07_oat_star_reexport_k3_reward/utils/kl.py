"""Sample-based estimators of KL(pi || pi_ref)."""

import torch

__all__ = ["kl_estimate"]


def kl_estimate(logps: torch.Tensor, ref_logps: torch.Tensor, kind: str = "k1") -> torch.Tensor:
    """Schulman's estimators on sampled tokens.

    k1: log-ratio (unbiased); k2: half squared log-ratio; k3: exp(-x) + x - 1
    (unbiased, non-negative, low variance).
    """
    x = logps - ref_logps
    if kind == "k1":
        return x
    if kind == "k2":
        return 0.5 * x * x
    if kind == "k3":
        return torch.expm1(-x) + x
    raise ValueError(kind)
