from dataclasses import dataclass, field

import torch


@dataclass
class KLConfig:
    """KL-to-reference settings.

    ``estimator`` names an entry of ``kl_estimators.KL_ESTIMATORS``.
    """

    coef: float = 0.04
    estimator: str = "low_var_kl"
    clamp: float = 10.0


@dataclass
class GRPOConfig:
    num_generations: int = 8
    epsilon_low: float = 0.2
    epsilon_high: float = 0.28
    scale_rewards: bool = True
    max_completion_length: int = 512
    temperature: float = 1.0
    dtype: str = "bfloat16"
    kl: KLConfig = field(default_factory=KLConfig)

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)
