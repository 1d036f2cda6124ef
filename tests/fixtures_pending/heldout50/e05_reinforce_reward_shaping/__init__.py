# Reviewer: a user's REINFORCE trainer split over a package. rewards.py shapes
# the per-token rewards with a KL to the reference, advantages.py turns them
# into returns (reward-to-go) minus a running baseline, trainer.py minimises
# -(advantages * logp) and backpropagates. The KL term is *added* to the
# rewards (non_score_reward = +kl_coef * kl): the policy is paid for moving
# away from the reference, an expected gradient of -kl_coef * grad
# KL(pi||pi_ref) in the minimised loss. BUG (KL006), reported on the line of
# rewards.py that computes the estimate.
from .advantages import RunningBaseline, compute_returns
from .config import ShapingConfig
from .rewards import shape_rewards
from .trainer import ReinforceTrainer

__all__ = ["RunningBaseline", "ShapingConfig", "ReinforceTrainer", "compute_returns", "shape_rewards"]
