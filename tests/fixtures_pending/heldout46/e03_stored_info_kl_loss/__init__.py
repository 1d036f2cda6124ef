# Reviewer: GRPO learner over three modules. maker.py computes a per-sequence
# k3 KL under torch.no_grad() and stores it in `experience.info["kl"]`;
# learner.py reads it back and adds `beta * experience.info["kl"].mean()` to
# the policy loss. The stored value has no gradient path to the policy, so the
# "KL loss" is a constant: bug (KL005), at the line in maker.py that computes
# the estimate.
"""Group-relative policy optimisation with a stored-experience buffer."""

from .experience import Experience, split_experience
from .learner import GRPOLearner
from .maker import ExperienceMaker

__all__ = ["Experience", "ExperienceMaker", "GRPOLearner", "split_experience"]
