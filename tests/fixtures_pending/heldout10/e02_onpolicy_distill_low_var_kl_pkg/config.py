"""Config for the on-policy distillation recipe (Hydra-like, as a dataclass)."""
from dataclasses import dataclass, field


@dataclass
class KLConfig:
    kl_penalty: str = "low_var_kl"  # one of: kl, abs, mse, low_var_kl
    kl_coef: float = 1.0


@dataclass
class DistillConfig:
    kl: KLConfig = field(default_factory=KLConfig)
    loss_agg_mode: str = "token-mean"
    temperature: float = 1.0
    max_response_length: int = 1024
