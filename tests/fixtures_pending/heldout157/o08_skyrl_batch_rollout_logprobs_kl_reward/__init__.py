# Reviewer: same layout as e08 (SkyRL-style; AlgorithmConfig, estimators.py,
# loss.py reading a TrainingInputBatch dict). The defaults here put the KL in
# the reward: use_kl_in_reward on, use_kl_loss off, kl_estimator_type "k1".
# The k1 estimate is built from batch["action_log_probs"] (rollout log-probs,
# no gradient) under no_grad, as a reward should be; its reward-to-go
# (flip/cumsum/flip) times kl_reward_coef is subtracted from the advantages
# that weight the fresh log-probs in the PPO loss. KL part of the gradient:
# kl_reward_coef * grad KL(pi||pi_ref) of the sequence.
# Verdict: correct. The detached k1 call and the (disabled) KL-loss call stay
# silent.
"""SkyRL-flavoured PPO policy loss with a KL loss."""

from .config import AlgorithmConfig
from . import estimators
from .loss import PolicyLoss, training_step

__all__ = [
    "AlgorithmConfig",
    "PolicyLoss",
    "estimators",
    "training_step",
]
