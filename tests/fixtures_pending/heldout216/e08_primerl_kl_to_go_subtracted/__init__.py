# Reviewer: a prime-rl-style package. utils/kl.py provides kl_to_go (the detached,
# masked reward-to-go of the log-ratio, G_t = sum_{s>=t} sg(logr_s)), re-exported by
# utils/__init__.py; trainer/loss.py builds the score-function KL term
# kl_penalty = sum_t G_t * logp_t (a correct estimator of grad KL(pi||pi_ref)) and then
# SUBTRACTS it from the minimised loss: loss = pg_loss - kl_coef * kl_penalty. Gradient
# descent increases KL(pi||pi_ref).
# Verdict: bug, KL006, reported on the line that multiplies the detached weight by the
# log-probs and is named as the penalty (`kl_penalty = ...` in trainer/loss.py).
"""RL trainer loss (prime-rl-like layout).

Entry point: ``trainer.loss.train_step``; the loss itself is ``compute_loss``.
"""

from .trainer.loss import LossConfig, compute_loss, train_step

__all__ = ["LossConfig", "compute_loss", "train_step"]


def default_config() -> "LossConfig":
    return LossConfig()
