# Reviewer: an oat-style package. utils/__init__.py re-exports utils/kl.py and
# utils/torch_functional.py; learner.py does `from .utils import *`. With the default
# args (kl_estimator="k3", kl_in_reward=True, kl_loss=False) compute_token_rewards puts
# -beta * k3 in the token rewards under no_grad, and the learner weights log pi by the
# reward-to-go of those rewards: the KL part of the gradient is
# beta * (grad KL(pi||pi_ref) - token-level grad KL(pi_ref||pi)), biased.
# Verdict: bug, KL004, reported inside compute_token_rewards (learner.py) on its line that
# calls kl_estimate(...): a helper of the loss's file that makes the estimate into
# rewards, the estimator picked from the args, not by a literal at the call.
"""Policy-gradient learner (oat-like layout).

Entry point: ``PGLearner.learning_step``.
"""

from .learner import PGArgs, PGLearner

__all__ = ["PGArgs", "PGLearner", "get_learner"]


def get_learner(model, optimizer, **kwargs):
    return PGLearner(model, optimizer, PGArgs(**kwargs))
