# Reviewer: the pipeline config; kl_loss_type defaults to "low_var_kl".
"""Pipeline configuration."""

from dataclasses import dataclass, field


@dataclass
class PPOConfig:
    pg_clip: float = 0.2
    init_kl_coef: float = 0.01
    use_kl_loss: bool = True
    kl_loss_type: str = "low_var_kl"
    response_length: int = 2048
    actor_train: dict = field(default_factory=lambda: {"lr": 1e-6, "micro_batch_size": 2})
