# Reviewer: oat-style learner package. advantages.compute_advantages runs
# under torch.no_grad() and stores on the batch the right estimator, k2 of the
# sequence log-ratio, computed from the rollout's log-probs; losses.pg_kl_loss
# adds beta * batch["kl"].mean() to the loss. The stored KL has no gradient
# path to the policy (built without gradient, from the behaviour log-probs): the
# regulariser is a constant for autograd.
# Verdict: bug, KL005, reported in advantages.py on the line that computes the
# stored estimate.
"""Policy-gradient learner in the oat layout (args / advantages / losses)."""
from dataclasses import dataclass


@dataclass
class LearnerArgs:
    beta: float = 0.05
    cliprange: float = 0.2
    reward_baseline: float = 0.0
    generate_max_length: int = 1024
    num_samples: int = 8


from .losses import PolicyGradientLearner, pg_kl_loss  # noqa: E402

__all__ = ["LearnerArgs", "PolicyGradientLearner", "pg_kl_loss"]
