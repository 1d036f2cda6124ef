"""ROLL-style pipeline in "both" mode: the low-variance k3 of each token enters the
sequence reward (detached, summed, weighting every token's log-prob) *and* the actor loss
(with gradient).  Alone, the reward part has gradient grad KL(pi||pi_ref) minus the
token-level grad of KL(pi_ref||pi) (KL004) and the loss part exactly that token-level
grad (KL002); their sum is grad KL(pi||pi_ref) of the sequence.  Not a bug.
"""
from .actor import actor_loss
from .kl import low_var_kl
from .pipeline import PipelineConfig, compute_sequence_rewards

__all__ = ["actor_loss", "low_var_kl", "PipelineConfig", "compute_sequence_rewards"]
