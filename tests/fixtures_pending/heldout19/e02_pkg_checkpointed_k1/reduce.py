"""Masked reductions shared by the losses."""

from typing import Optional

import torch


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: Optional[int] = None) -> torch.Tensor:
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp(min=1.0)
    return (values * mask).sum(dim) / mask.sum(dim).clamp(min=1.0)


def batch_mean(values: torch.Tensor) -> torch.Tensor:
    return values.mean()
