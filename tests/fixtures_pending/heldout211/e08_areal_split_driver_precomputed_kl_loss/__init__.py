# Reviewer: AReaL-style trainer split over a driver (ray_trainer.py: fit()) and a
# worker (dp_actor.py: update_policy). To save the worker a second look at the
# reference, the driver computes the KL once, right after the ref worker group
# returns, from the rollout log-probs old_log_probs (computed by the rollout worker
# without gradient) and stores it as data.batch["ref_kl"]. The worker adds
# kl_loss_coef * ref_kl to its loss: a constant for autograd. Gradient: exactly 0.
# Verdict: bug, KL005, reported in ray_trainer.py on the line that computes the
# estimate (`batch.batch["ref_kl"] = kl_estimate(...)`); the worker only adds it.
"""Entry point of the recipe: ``main`` builds the config, the trainer and runs fit()."""
from .config import PPOConfig
from .dp_actor import DataParallelPPOActor
from .ray_trainer import RayPPOTrainer

__all__ = ["PPOConfig", "DataParallelPPOActor", "RayPPOTrainer", "main", "build_actor"]


def build_actor(config: PPOConfig, actor_module, actor_optimizer):
    """What the ActorRolloutRefWorker does in init_model(): one actor per rank."""
    return DataParallelPPOActor(config.actor, actor_module=actor_module, actor_optimizer=actor_optimizer)


def main(config: PPOConfig = None, *, actor_rollout_wg, ref_policy_wg, reward_fn, dataloader):
    config = config or PPOConfig()
    trainer = RayPPOTrainer(config, actor_rollout_wg=actor_rollout_wg, ref_policy_wg=ref_policy_wg, reward_fn=reward_fn)
    return trainer.fit(dataloader)
