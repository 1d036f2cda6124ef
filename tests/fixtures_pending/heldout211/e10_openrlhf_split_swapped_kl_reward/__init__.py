# Reviewer: OpenRLHF-style PPO split over a driver (ray_trainer.py: fit() calls
# apply_kl_penalty, then REINFORCE++ returns) and a worker (dp_actor.py: clipped
# policy loss on the advantages; KL loss off). The KL is a k1 reward, but
# apply_kl_penalty passes the reference log-probs FIRST to
# kl_estimate(logprob, ref_logprob, ...): the estimate is ref - old = -log-ratio, and
# rewards = scores - kl_coef * kld ADDS kl_coef * log-ratio to every token's reward.
# Expected gradient of the loss: exactly -kl_coef * grad KL(pi||pi_ref): a bonus.
# Verdict: bug, KL006, reported in ray_trainer.py inside apply_kl_penalty, on the
# `kld = kl_estimate(...)` line where the arguments are swapped.
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
