# Reviewer: config defaults of the item (dataclasses). See __init__.py for the whole item.
# Verdict: bug, KL005, reported in ray_trainer.py on the line that computes the
# estimate (`batch.batch["ref_kl"] = kl_estimate(...)`); the worker only adds it.
from dataclasses import dataclass, field


@dataclass
class KLControlConfig:
    type: str = "fixed"
    kl_coef: float = 0.001
    target_kl: float = 0.1
    horizon: int = 10000


@dataclass
class AlgorithmConfig:
    adv_estimator: str = "reinforce_plus_plus"
    gamma: float = 1.0
    whiten_advantages: bool = False
    use_kl_in_reward: bool = False
    kl_penalty: str = "kl"
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)


@dataclass
class ActorConfig:
    strategy: str = "fsdp"
    ppo_epochs: int = 1
    ppo_micro_batch_size_per_gpu: int = 4
    clip_ratio: float = 0.2
    loss_agg_mode: str = "seq-mean-token-sum"
    entropy_coeff: float = 0.0
    use_kl_loss: bool = True
    kl_loss_coef: float = 0.01
    kl_loss_type: str = "low_var_kl"
    grad_clip: float = 1.0


@dataclass
class TrainerConfig:
    project_name: str = "verl_examples"
    experiment_name: str = "areal-boba-kl"
    total_epochs: int = 1
    logger: tuple = ("console",)


@dataclass
class PPOConfig:
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
