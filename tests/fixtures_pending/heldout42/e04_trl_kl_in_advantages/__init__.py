# Reviewer: TRL-PPO-style package in three modules. kl.py holds the estimator
# switch; advantages.py runs GAE on the score-only rewards and then subtracts
# the per-token KL (k1, picked with a literal at the call) *from the
# advantages*, token by token; ppo_step.py minimises the clipped surrogate on
# those advantages. Each token's score is then weighted by its own log-ratio
# only, never by the KL of the tokens sampled after it: the KL part of the
# expected gradient is kl_coef * E[sum_t logr_t grad logp_t], the token-level
# partial gradient of KL(pi||pi_ref). Bug: KL003, reported at the line of
# advantages.py that calls the estimator (the helper making it into
# advantages).
from .advantages import AdvantageConfig, compute_advantages
from .ppo_step import PPOStepConfig, ppo_step

__all__ = ["AdvantageConfig", "compute_advantages", "PPOStepConfig", "ppo_step"]
