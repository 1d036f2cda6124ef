"""verl-style agent loop: rollout worker puts the KL into token-level rewards,
an advantage estimator registered by name turns them into advantages, and the
actor's PPO loss reads ``data.batch["advantages"]`` back."""
from . import core_algos, dp_actor, ray_trainer  # noqa: F401
