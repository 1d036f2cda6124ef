from dataclasses import dataclass


@dataclass
class DistillConfig:
    beta: float = 0.1
    temperature: float = 1.0
    kl_estimator: str = "low_var_kl"
    max_new_tokens: int = 256
