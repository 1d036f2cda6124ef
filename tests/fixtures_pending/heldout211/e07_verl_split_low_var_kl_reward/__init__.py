# Reviewer: verl-style recipe (DAPO-like fork) split over a driver and a worker. The
# KL sits in the rewards: config.py sets algorithm.use_kl_in_reward=True with
# kl_penalty="low_var_kl", and the worker's KL loss is off (actor.use_kl_loss=False).
# The driver (ray_trainer.py, fit) calls apply_kl_penalty(batch, kl_ctrl,
# kl_penalty=algo.kl_penalty): k3 of the rollout log-probs, no gradient, subtracted
# from the token rewards and credited by REINFORCE++ returns (gamma=1). The worker
# (dp_actor.py) weights log_prob by those advantages. Expected gradient:
# 0.001 * (grad KL(pi||pi_ref) - token-level grad KL(pi_ref||pi)): biased.
# Verdict: bug, KL004, reported in ray_trainer.py inside apply_kl_penalty, on its
# line that calls the estimator (the call in fit() passes a config value, no literal).
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
