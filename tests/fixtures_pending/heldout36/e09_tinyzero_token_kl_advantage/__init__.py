# Review: apply_kl_to_advantage subtracts beta * (logp - ref) from each token's
# own advantage only. The KL reward is never accumulated over later tokens, so
# the policy gradient gets only the token-level part of grad KL(pi||ref).
from .core_algos import apply_kl_to_advantage, compute_grpo_outcome_advantage
from .ray_trainer import compute_advantage, update_actor

__all__ = ["apply_kl_to_advantage", "compute_grpo_outcome_advantage", "compute_advantage", "update_actor"]
