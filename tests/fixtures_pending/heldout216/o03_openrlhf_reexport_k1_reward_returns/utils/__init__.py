"""Utilities re-exported for the trainers and the models."""

from .kl import compute_approx_kl, compute_reward
from .torch_functional import (
    entropy_from_logits,
    log_probs_from_logits,
    masked_mean,
    masked_sum,
)

__all__ = [
    "compute_approx_kl",
    "compute_reward",
    "entropy_from_logits",
    "log_probs_from_logits",
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
