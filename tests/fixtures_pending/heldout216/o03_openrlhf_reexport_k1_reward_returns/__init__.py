# Reviewer: the same OpenRLHF-style package as e03 (compute_approx_kl re-exported by
# utils/__init__.py, default kl_estimator "k1"), but REINFORCE++ style: use_kl_loss is
# off and make_experience() computes the k1 log-ratio under no_grad, puts -kl_coef * k1
# into the token rewards with utils.compute_reward, and credits it by returns (a reverse
# cumulative sum, gamma = 1). The policy loss weights log pi by those returns: the KL
# part of the gradient is exactly kl_coef * grad KL(pi||pi_ref) of the sequence.
# Verdict: correct. The k1 call in make_experience stays silent.
"""Actor-side PPO loss (OpenRLHF-like).

Entry point: ``ActorLoss.training_step`` on ``make_experience``'s output.
"""

from .models.actor_loss import ActorLoss, ActorArgs

__all__ = ["ActorArgs", "ActorLoss", "build"]


def build(actor, optimizer, **kwargs):
    """Build the actor loss from command-line style keyword arguments."""
    return ActorLoss(actor, optimizer, ActorArgs(**kwargs))


def default_args():
    return ActorArgs()
