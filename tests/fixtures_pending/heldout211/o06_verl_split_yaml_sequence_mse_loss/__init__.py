# Reviewer: verl-style recipe split over a driver and a worker, as e06: the YAML
# dict in config.py turns the dataclass default "low_var_kl" into "mse", and also
# sets kl_loss_level="sequence". The worker then sums the masked log-probs over the
# response before calling kl_estimate: k2 of the SEQUENCE log-ratio, whose
# gradient's expectation is exactly grad KL(pi||pi_ref) (x kl_loss_coef).
# Verdict: correct. The kl_estimate call (a k2, tempting KL003) and the unused
# low_var_kl default stay silent.
"""Entry point of the recipe: ``main`` builds the config, the trainer and runs fit()."""
from .config import PPOConfig, load_config
from .dp_actor import DataParallelPPOActor
from .ray_trainer import RayPPOTrainer

__all__ = ["PPOConfig", "DataParallelPPOActor", "RayPPOTrainer", "main", "build_actor"]


def build_actor(config: PPOConfig, actor_module, actor_optimizer):
    """What the ActorRolloutRefWorker does in init_model(): one actor per rank."""
    return DataParallelPPOActor(config.actor, actor_module=actor_module, actor_optimizer=actor_optimizer)


def main(config: PPOConfig = None, *, actor_rollout_wg, ref_policy_wg, reward_fn, dataloader):
    config = config or load_config()
    trainer = RayPPOTrainer(config, actor_rollout_wg=actor_rollout_wg, ref_policy_wg=ref_policy_wg, reward_fn=reward_fn)
    return trainer.fit(dataloader)
