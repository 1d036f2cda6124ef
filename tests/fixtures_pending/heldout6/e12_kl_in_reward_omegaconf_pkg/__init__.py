"""Package: KL-in-reward selected by `config.algorithm.kl_penalty`, helper and losses in core_algos, driver in ray_trainer."""
from .core_algos import compute_gae_advantage_return, compute_policy_loss, kl_penalty

__all__ = ["compute_gae_advantage_return", "compute_policy_loss", "kl_penalty"]
