# Reviewer: hyper-parameters of the REINFORCE package: KL coefficient,
# discount and baseline momentum.
from dataclasses import dataclass


@dataclass
class ShapingConfig:
    kl_coef: float = 0.05
    gamma: float = 1.0
    baseline_momentum: float = 0.9
    score_clip: float = 5.0
    lr: float = 1e-6
    max_grad_norm: float = 1.0
    temperature: float = 1.0

    def __post_init__(self):
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError("gamma must be in (0, 1]")
        if self.kl_coef < 0:
            raise ValueError("kl_coef must be non-negative")
