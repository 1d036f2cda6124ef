"""Masked reductions shared by the actor and critic losses."""

from typing import Optional

import torch


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: Optional[int] = None) -> torch.Tensor:
    if dim is None:
        return (values * mask).sum()
    return (values * mask).sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: Optional[int] = None) -> torch.Tensor:
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1)


def reverse_cumsum(values: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """out[t] = sum_{s >= t} values[s] along ``dim``."""
    return torch.flip(torch.cumsum(torch.flip(values, dims=[dim]), dim=dim), dims=[dim])
