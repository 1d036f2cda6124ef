# Reviewer: verl-style `core_algos` package. __init__ binds kl_penalty from
# .estimators (log-ratio value, reward-to-go gradient: correct), and then runs
# `from .legacy import *` to keep old recipes importing. legacy.py has no
# __all__, so the star import re-binds the package's kl_penalty to the legacy
# helper, which returns the plain log-ratio k1. actor.py takes `kl_penalty` from
# the package and adds it, with its gradient, to the policy loss: the expected
# gradient of the KL term is zero.
# Verdict: bug, KL001, reported in actor.py on the `kld = kl_penalty(...)` call
# in compute_policy_loss (the helper returns the estimate; the call is the loss's).
"""Core PPO algorithms shared by the actor and critic workers."""
from dataclasses import dataclass

from .estimators import agg_loss, kl_penalty, masked_mean
from .legacy import *  # noqa: F401,F403  (0.2 import paths)


@dataclass
class ActorConfig:
    clip_ratio: float = 0.2
    use_kl_loss: bool = True
    kl_loss_coef: float = 0.05
    ppo_micro_batch_size: int = 4
    ppo_epochs: int = 1


def default_actor_config() -> ActorConfig:
    return ActorConfig()


from .actor import DataParallelPPOActor  # noqa: E402  (needs the names above)

__all__ = ["ActorConfig", "DataParallelPPOActor", "agg_loss", "default_actor_config", "kl_penalty", "masked_mean"]
