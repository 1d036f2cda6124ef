"""Registry of per-token KL estimators, looked up by name from the config."""
from typing import Callable, Dict, Optional

import torch

KLFn = Callable[..., torch.Tensor]
KL_ESTIMATORS: Dict[str, KLFn] = {}


def register_kl(*names: str) -> Callable[[KLFn], KLFn]:
    def decorator(fn: KLFn) -> KLFn:
        for name in names:
            if name in KL_ESTIMATORS:
                raise ValueError(f"duplicate KL estimator {name!r}")
            KL_ESTIMATORS[name] = fn
        return fn

    return decorator


@register_kl("k1", "kl")
def _k1(logprob: torch.Tensor, ref_logprob: torch.Tensor, clamp: Optional[float] = None) -> torch.Tensor:
    return logprob - ref_logprob


@register_kl("k2", "mse")
def _k2(logprob: torch.Tensor, ref_logprob: torch.Tensor, clamp: Optional[float] = None) -> torch.Tensor:
    return 0.5 * (logprob - ref_logprob).square()


@register_kl("k3", "low_var_kl")
def _k3(logprob: torch.Tensor, ref_logprob: torch.Tensor, clamp: Optional[float] = None) -> torch.Tensor:
    # Schulman's unbiased, always-positive estimator
    log_ratio = ref_logprob - logprob
    # ok: KL002
    kl = log_ratio.exp() - log_ratio - 1
    if clamp is not None:
        kl = torch.clamp(kl, min=-clamp, max=clamp)
    return kl


def get_kl_estimator(name: str) -> KLFn:
    try:
        return KL_ESTIMATORS[name]
    except KeyError:
        raise ValueError(f"unknown KL estimator {name!r}; choose from {sorted(KL_ESTIMATORS)}") from None
