# Reviewer: the same SkyRL-style package as e10 (compute_approx_kl decorated with
# @torch.no_grad() in utils/ppo_utils.py), but use_kl_loss is off and the KL goes into
# the rewards: apply_kl_penalty subtracts kl_coef * k1 (the default estimator here) from
# the token rewards, GAE with gamma = lambd = 1 turns them into advantages, and the PPO
# loss weights log pi by them. A detached KL in a reward is how it should be; credited by
# returns, its gradient is exactly kl_coef * grad KL(pi||pi_ref) of the sequence.
# Verdict: correct. The no_grad compute_approx_kl call in apply_kl_penalty stays silent.
"""PPO policy loss (SkyRL-like layout).

Entry point: ``trainer.ppo_loss.PolicyLoss.step``.
"""

from .trainer.ppo_loss import PolicyLoss, PolicyLossConfig

__all__ = ["PolicyLoss", "PolicyLossConfig", "from_dict"]


def from_dict(cfg: dict) -> PolicyLoss:
    """Build the loss from the ``trainer.algorithm`` section of the config."""
    return PolicyLoss(PolicyLossConfig(**cfg))
