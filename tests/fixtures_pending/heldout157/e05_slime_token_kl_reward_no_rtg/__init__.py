# Reviewer: a slime-style actor split over a package. rewards.py turns the
# rollout log-probs into a per-token KL reward, -kl_coef * (logp - ref), under
# no_grad; advantages.py builds the token advantages as that token's KL
# reward plus the (group-normalised) sequence score broadcast over the
# response, with no reward-to-go; loss.py weights logp with them in the PPO
# loss and calls .backward(). Each token's score is credited with its own KL
# only: the KL part of the gradient is the token-level partial
# E[sum_t logr_t grad logp_t], not grad KL(pi||pi_ref) of the sequence.
# Verdict: bug, KL003, reported in rewards.py on the line that computes the
# KL reward (the estimate is written inside that line).
"""slime-flavoured GRPO actor with a per-token KL reward."""

from .rewards import compute_kl_rewards
from .advantages import compute_token_advantages
from .loss import policy_loss_function, train_step

__all__ = [
    "compute_kl_rewards",
    "compute_token_advantages",
    "policy_loss_function",
    "train_step",
]
