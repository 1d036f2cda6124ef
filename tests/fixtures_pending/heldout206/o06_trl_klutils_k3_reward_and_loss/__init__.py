# Reviewer: the same TRL-style package as e06, with the KL charged in BOTH
# places and the same beta: rewards.py subtracts beta * sum_t sg(k3_t) from each
# completion's reward (KLUtils.k3 under no_grad; the advantage multiplies every
# token's log-prob), and trainer.py adds beta * KLUtils.k3(...) with gradient per
# token. Per token the weight is sum_s k3_s + (1 - exp(-logr_t)); given the
# prefix, k3_t + 1 - exp(-logr_t) = logr_t and the later k3_s have the
# conditional means of the later logr_s, so the expected gradient is
# grad KL(pi||pi_ref) of the sequence ("both" in the rule book). Each half alone
# would be wrong; the two sit in different modules and are always run together.
# Verdict: correct. The KLUtils.k3 calls in rewards.py and trainer.py stay silent.
"""GRPO with a k3 KL reward and a k3 KL loss, in a TRL-like layout (config / kl_utils / rewards / trainer)."""
from dataclasses import dataclass


@dataclass
class KLGRPOConfig:
    beta: float = 0.04
    max_completion_length: int = 256
    num_generations: int = 8
    loss_type: str = "dr_grpo"
    learning_rate: float = 1e-6


from .trainer import KLRegularisedTrainer  # noqa: E402

__all__ = ["KLGRPOConfig", "KLRegularisedTrainer"]
