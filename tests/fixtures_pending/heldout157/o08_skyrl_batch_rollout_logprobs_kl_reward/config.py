# Part of o08 (see __init__.py).
from dataclasses import dataclass


@dataclass
class AlgorithmConfig:
    advantage_estimator: str = "grpo"
    policy_loss_type: str = "regular"
    loss_reduction: str = "sequence_sum"
    eps_clip_low: float = 0.2
    eps_clip_high: float = 0.2
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    # "k1" | "k2" | "k3" | "abs"
    kl_estimator_type: str = "k1"
    use_kl_in_reward: bool = True
    kl_reward_coef: float = 0.05
    use_entropy_loss: bool = False
    entropy_loss_coef: float = 0.01

    def validate(self):
        if self.use_kl_loss and self.use_kl_in_reward:
            raise ValueError("use either the KL loss or the in-reward KL, not both")
        return self
