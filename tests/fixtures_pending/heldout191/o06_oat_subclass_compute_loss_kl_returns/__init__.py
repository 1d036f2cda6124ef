# Reviewer: same learners as e06, roles reversed. The base class's compute_loss
# (pg_learner.py) adds the KL reward to its own token's advantage only, but it is
# overridden: get_learner() builds RLOOLearner, whose compute_loss credits
# -beta*log-ratio by returns (reverse cumsum over the response). The base method
# is never called (no super().compute_loss). Expected gradient: beta times
# grad KL(pi||pi_ref) of the sequence.
# Verdict: correct. The override's KL reward and the dead base method stay silent.
"""Learners for online RL with a reference-KL penalty."""
from dataclasses import dataclass


@dataclass
class PPOArgs:
    beta: float = 0.05
    num_samples: int = 4
    learn_bs: int = 8
    max_grad_norm: float = 1.0
    algo: str = "rloo"


def get_learner(args: PPOArgs = None, policy=None, ref=None):
    from .rloo_learner import RLOOLearner

    args = args or PPOArgs()
    return RLOOLearner(args, policy, ref)


__all__ = ["PPOArgs", "get_learner"]
