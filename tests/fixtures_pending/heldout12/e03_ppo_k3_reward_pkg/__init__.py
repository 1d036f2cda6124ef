"""PPO with a critic; the KL to the reference is applied in the token-level rewards."""
from .config import load_config
from .trainer import PPOTrainer, apply_kl_penalty

__all__ = ["load_config", "PPOTrainer", "apply_kl_penalty"]
