# Reviewer: prime-rl-style trainer split over a driver and a worker, as e09: the
# worker builds the KL from the batch's old_log_probs (no gradient). Here it is the
# k1 log-ratio, turned into a KL-to-go (masked reverse cumulative sum) and
# subtracted from the advantages that weight the ratio in the clipped policy loss:
# a detached KL reward credited by a reward-to-go. Expected gradient: exactly
# kl_loss_coef * grad KL(pi||pi_ref) of the sequence. No KL term joins the loss.
# Verdict: correct. The detached k1 (tempting KL005/KL001) stays silent.
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
