"""Numerical helpers for the RL losses."""

from .kl import kl_to_go, log_ratio
from .torch_functional import (
    entropy_from_logits,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
)

__all__ = [
    "entropy_from_logits",
    "kl_to_go",
    "log_ratio",
    "logprobs_from_logits",
    "masked_mean",
    "masked_sum",
]


def get_helper(name: str):
    """Look up a re-exported helper by name (used by config validation)."""
    if name not in __all__:
        raise KeyError(f"{name!r} is not exported by {__name__}; choose from {sorted(__all__)}")
    return globals()[name]


def available_helpers():
    return sorted(__all__)
