# Reviewer: a NeMo-RL-style loss package. registry.py holds a decorator
# registry; estimators.py registers the KL estimators into it (imported here
# for its side effect); loss.py resolves the estimator by name in __init__
# from DEFAULT_LOSS_CONFIG["kl_type"] = "k2" and calls it from the loss. The
# per-token k2, 0.5 * (logp - ref)^2, is summed over the tokens of each
# sampled sequence: its gradient is the token-level partial
# E[sum_t logr_t grad logp_t], not grad KL(pi||pi_ref) of the sequence.
# Verdict: bug, KL003, reported in loss.py on the line that calls self.kl_fn(...)
# (the registered estimator, from another module) from the loss.
"""Clipped policy-gradient loss with a registered KL penalty."""

from . import registry
from . import estimators  # noqa: F401  (registers "k1", "k2", "k3")
from .loss import DEFAULT_LOSS_CONFIG, ClippedPGLossFn

available_kl_types = registry.available

__all__ = [
    "ClippedPGLossFn",
    "DEFAULT_LOSS_CONFIG",
    "available_kl_types",
]
