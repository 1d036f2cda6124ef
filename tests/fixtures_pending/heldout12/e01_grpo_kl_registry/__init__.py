"""GRPO trainer with a pluggable KL estimator registry."""
from .config import GRPOConfig, KLConfig
from .kl_estimators import KL_ESTIMATORS, get_kl_estimator
from .trainer import GRPOTrainer

__all__ = ["GRPOConfig", "KLConfig", "KL_ESTIMATORS", "get_kl_estimator", "GRPOTrainer"]
