# Reviewer: a name -> function registry filled by the register_kl decorator.
"""Registry of per-response KL estimators."""

from typing import Callable, Dict

import torch

KLFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
KL_ESTIMATORS: Dict[str, KLFn] = {}


def register_kl(*names: str):
    def decorator(fn: KLFn) -> KLFn:
        for name in names:
            if name in KL_ESTIMATORS:
                raise KeyError(f"KL estimator {name!r} registered twice")
            KL_ESTIMATORS[name] = fn
        return fn

    return decorator


def get_kl_estimator(name: str) -> KLFn:
    try:
        return KL_ESTIMATORS[name]
    except KeyError:
        raise ValueError(f"unknown kl_loss_type {name!r}; known: {sorted(KL_ESTIMATORS)}") from None
