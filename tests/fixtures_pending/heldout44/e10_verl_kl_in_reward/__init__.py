# Reviewer: a verl-style PPO driver with the reference KL in the rewards
# (`algorithm.use_kl_in_reward: true`). The estimator is `algorithm.kl_penalty` from
# ppo_trainer.yaml next to the code: low_var_kl. apply_kl_penalty (same file as the
# trainer that calls it with the config's value) puts that k3 in the token-level
# rewards, which compute_advantage credits by returns (a reverse cumulative sum): a k3
# reward, biased: grad KL(pi||pi_ref) minus the token-level gradient of KL(pi_ref||pi)
# (KL004, at the line in apply_kl_penalty that computes the estimate). With
# `kl_penalty: kl` the same code is correct.
"""PPO with a KL penalty in the rewards."""

from .actor import update_policy
from .ray_trainer import RayPPOTrainer, apply_kl_penalty, compute_advantage

__all__ = ["RayPPOTrainer", "apply_kl_penalty", "compute_advantage", "update_policy"]
