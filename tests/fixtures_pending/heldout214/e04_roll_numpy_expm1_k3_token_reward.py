# Reviewer: ROLL-style REINFORCE pipeline whose token-level KL reward is built
# on the driver in NumPy: log-probs come over with .cpu().numpy(), the KL is
# np.expm1(-logr) + logr (= exp(ref - logp) - (ref - logp) - 1: the k3 /
# "low_var_kl" estimate), -kl_coef * kl goes into the token rewards, the score
# is added on the last token, and returns are a reverse cumulative sum (gamma 1)
# brought back with torch.as_tensor. The returns weight logp in the policy
# loss, so k3 acts as a reward: the expected KL gradient is grad KL(pi||pi_ref)
# minus the token-level grad KL(pi_ref||pi), biased.
# Verdict: bug, KL004, reported inside compute_token_level_rewards on the k3 line.
from dataclasses import dataclass

import numpy as np
import torch

from roll.distributed.scheduler.protocol import DataProto
from roll.utils.functionals import masked_whiten


@dataclass
class RewardConfig:
    kl_coef: float = 0.05
    gamma: float = 1.0
    whiten_advantages: bool = False


def compute_token_level_rewards(old_log_probs, ref_log_probs, response_mask, scores, cfg: RewardConfig):
    old = old_log_probs.detach().cpu().numpy()
    ref = ref_log_probs.detach().cpu().numpy()
    mask = response_mask.detach().cpu().numpy().astype(old.dtype)
    log_ratio = (old - ref) * mask
    # error: KL004
    kl = (np.expm1(-log_ratio) + log_ratio) * mask
    rewards = -cfg.kl_coef * kl
    last = mask.sum(axis=-1).astype(np.int64) - 1
    rewards[np.arange(rewards.shape[0]), last] += scores.detach().cpu().numpy()
    returns = np.zeros_like(rewards)
    running = np.zeros(rewards.shape[0], dtype=rewards.dtype)
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + cfg.gamma * running
        returns[:, t] = running
    returns = torch.as_tensor(returns * mask, device=old_log_probs.device)
    stats = {"critic/kl": float((kl.sum(-1) / np.maximum(mask.sum(-1), 1)).mean())}
    return returns, stats


def actor_loss(log_probs, returns, response_mask, cfg: RewardConfig):
    adv = returns
    if cfg.whiten_advantages:
        adv = masked_whiten(adv, response_mask)
    return -(adv * log_probs * response_mask).sum(-1).mean()


def train_step(actor, batch: DataProto, cfg: RewardConfig):
    returns, stats = compute_token_level_rewards(
        batch.batch["old_log_probs"],
        batch.batch["ref_log_probs"],
        batch.batch["response_mask"],
        batch.batch["scores"],
        cfg,
    )
    log_probs = actor.compute_log_probs(batch)
    loss = actor_loss(log_probs, returns, batch.batch["response_mask"], cfg)
    loss.backward()
    stats["actor/loss"] = loss.item()
    return stats
