# Reviewer: SkyRL-style trainer whose defaults are a TOML document embedded in
# the module. The TOML sets `kl_coef = -0.01` with the comment that the KL enters
# as `kl_coef * kl` and a negative value penalises; that is true for the
# "reward" placement (rewards + kl_coef * kl). The default `kl_placement` is
# "loss", where the same signed coefficient multiplies k2 of the sequence
# log-ratio and is ADDED to a minimised loss: `loss + (-0.01) * KL`, a bonus.
# Gradient descent increases KL(pi||pi_ref).
# Verdict: bug, KL006, reported on the `kl_term = 0.5 * (...)` line that
# computes the estimate (the minus sign sits in the default coefficient).
import tomllib
from types import SimpleNamespace

import torch

from skyrl_train.trainer import RayPPOTrainer
from skyrl_train.utils.ppo_utils import masked_mean

_DEFAULT_TOML = """
[trainer]
policy_model = "Qwen/Qwen2.5-1.5B-Instruct"
micro_train_batch_size = 4

[trainer.algorithm]
eps_clip = 0.2
# The KL always enters as `kl_coef * kl`; negative values penalise the KL.
kl_coef = -0.01
kl_placement = "loss"   # "loss" | "reward"
"""


def default_config(overrides=None):
    raw = tomllib.loads(_DEFAULT_TOML)
    algo = dict(raw["trainer"]["algorithm"], **(overrides or {}))
    return SimpleNamespace(**algo)


@torch.no_grad()
def token_rewards_with_kl(cfg, scores, logprobs, ref_logprobs, loss_mask):
    rewards = torch.zeros_like(logprobs)
    if cfg.kl_placement == "reward":
        kl = (logprobs - ref_logprobs) * loss_mask
        rewards = rewards + cfg.kl_coef * kl
    last = loss_mask.sum(-1).long() - 1
    rewards[torch.arange(rewards.shape[0]), last] += scores
    return rewards * loss_mask


def policy_loss(cfg, logprobs, old_logprobs, ref_logprobs, rewards, loss_mask):
    returns = (rewards * loss_mask).flip(-1).cumsum(-1).flip(-1)
    ratio = torch.exp(logprobs - old_logprobs)
    clipped = ratio.clamp(1 - cfg.eps_clip, 1 + cfg.eps_clip)
    pg = torch.max(-returns * ratio, -returns * clipped)
    loss = (pg * loss_mask).sum(-1).mean()
    if cfg.kl_placement == "loss":
        # error: KL006
        kl_term = 0.5 * ((logprobs - ref_logprobs) * loss_mask).sum(-1).pow(2)
        loss = loss + cfg.kl_coef * kl_term.mean()
    return loss


def training_step(cfg, policy, optimizer, batch):
    logprobs = policy.forward_logprobs(batch["sequences"], batch["attention_mask"])
    rewards = token_rewards_with_kl(
        cfg, batch["scores"], logprobs.detach(), batch["ref_logprobs"], batch["loss_mask"]
    )
    loss = policy_loss(cfg, logprobs, batch["old_logprobs"], batch["ref_logprobs"], rewards, batch["loss_mask"])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return {"loss": loss.item(), "reward": masked_mean(rewards, batch["loss_mask"]).item()}


if __name__ == "__main__":
    RayPPOTrainer(default_config()).train()
