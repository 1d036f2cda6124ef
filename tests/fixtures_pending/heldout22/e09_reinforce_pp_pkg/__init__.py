"""REINFORCE++: critic-free PPO with KL-shaped token rewards, discounted
returns and batch-whitened advantages."""
from .trainer import ReinforcePPConfig, ReinforcePPTrainer

__all__ = ["ReinforcePPConfig", "ReinforcePPTrainer"]
