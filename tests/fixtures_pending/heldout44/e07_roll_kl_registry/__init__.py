# Reviewer: a ROLL-style actor worker whose KL loss function is looked up in a
# decorator-filled registry (registry.py, estimators.py) by PPOConfig.kl_loss_type
# (config.py), default "low_var_kl": the per-token k3 summed over each response,
# differentiated as a loss. Expected gradient: the token-level gradient of
# KL(pi_ref||pi) (KL002), reported where the worker calls the registered function.
# The registered "seq_mse" would be correct.
"""Actor worker with a registry of KL losses."""

from . import estimators  # noqa: F401  (fills the registry)
from .actor_worker import ActorWorker
from .config import PPOConfig
from .registry import KL_ESTIMATORS, get_kl_estimator, register_kl

__all__ = ["KL_ESTIMATORS", "ActorWorker", "PPOConfig", "get_kl_estimator", "register_kl"]
