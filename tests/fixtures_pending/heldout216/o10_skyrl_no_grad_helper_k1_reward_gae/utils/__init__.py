"""Algorithm utilities for the PPO trainer."""

from .ppo_utils import compute_approx_kl, reduce_loss
from .torch_functional import entropy_from_logits, logprobs_from_logits, masked_mean, masked_sum

__all__ = [
    "compute_approx_kl",
    "entropy_from_logits",
    "logprobs_from_logits",
    "masked_mean",
    "masked_sum",
    "reduce_loss",
]


def get_helper(name: str):
    """Look up a re-exported helper by name (used by config validation)."""
    if name not in __all__:
        raise KeyError(f"{name!r} is not exported by {__name__}; choose from {sorted(__all__)}")
    return globals()[name]


def available_helpers():
    return sorted(__all__)
