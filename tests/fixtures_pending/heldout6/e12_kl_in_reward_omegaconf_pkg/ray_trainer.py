"""Driver: applies the in-reward KL penalty chosen by the OmegaConf config, computes GAE, updates the actor."""
import torch
from omegaconf import OmegaConf

from . import core_algos

CONFIG = OmegaConf.create(
    {
        "algorithm": {
            "gamma": 1.0,
            "lam": 1.0,
            "use_kl_in_reward": True,
            "kl_penalty": "low_var_kl",
            "kl_ctrl": {"type": "fixed", "kl_coef": 0.05},
        },
        "actor": {"clip_ratio": 0.2, "use_kl_loss": False},
    }
)


@torch.no_grad()
def apply_kl_penalty(batch, kl_coef, kl_penalty="kl"):
    response_mask = batch["response_mask"]
    # error: KL004
    kld = core_algos.kl_penalty(batch["old_log_probs"], batch["ref_log_prob"], kl_penalty=kl_penalty)
    kld = kld * response_mask
    batch["token_level_rewards"] = batch["token_level_scores"] - kl_coef * kld
    return {"actor/reward_kl_penalty": (kld.sum(-1) / response_mask.sum(-1)).mean().item()}


def compute_log_prob(actor, batch):
    logits = actor(batch["input_ids"]).logits[:, -batch["responses"].size(1) - 1 : -1]
    return torch.log_softmax(logits, -1).gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)


def fit_step(actor, critic, optimizer, batch, config=CONFIG):
    algo = config.algorithm
    metrics = {}
    if algo.use_kl_in_reward:
        metrics.update(apply_kl_penalty(batch, algo.kl_ctrl.kl_coef, kl_penalty=algo.kl_penalty))
    advantages, returns = core_algos.compute_gae_advantage_return(
        batch["token_level_rewards"], batch["values"], batch["response_mask"], gamma=algo.gamma, lam=algo.lam
    )
    log_prob = compute_log_prob(actor, batch)
    pg_loss = core_algos.compute_policy_loss(
        log_prob, batch["old_log_probs"], advantages, batch["response_mask"], cliprange=config.actor.clip_ratio
    )
    optimizer.zero_grad()
    pg_loss.backward()
    optimizer.step()
    metrics["actor/pg_loss"] = pg_loss.item()
    return metrics
