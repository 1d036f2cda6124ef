# Reviewer: SkyRL-style trainer with defaults in an embedded TOML document, as
# e09, same signed `kl_coef = -0.01`, but the default `kl_placement` is "reward":
# the detached k1 enters the per-token rewards as `rewards + kl_coef * kl`
# (= -0.01 * sg(logr_t), a penalty), the returns are reverse cumulative sums,
# and the loss is -returns * ratio. The KL part of the gradient is
# +0.01 * grad KL(pi||pi_ref) of the sequence. The `rewards + kl_coef * kl`
# line looks like a KL reward added to the rewards, but the default coefficient
# is negative; the "loss" branch (a bonus with this sign) is not selected.
# Verdict: correct. The reward line and the unselected loss-branch estimate stay silent.
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
kl_placement = "reward"   # "loss" | "reward"
"""


def default_config(overrides=None):
    raw = tomllib.loads(_DEFAULT_TOML)
    algo = dict(raw["trainer"]["algorithm"], **(overrides or {}))
    return SimpleNamespace(**algo)


@torch.no_grad()
def token_rewards_with_kl(cfg, scores, logprobs, ref_logprobs, loss_mask):
    rewards = torch.zeros_like(logprobs)
    if cfg.kl_placement == "reward":
        # ok: KL001
        kl = (logprobs - ref_logprobs) * loss_mask
        # ok: KL006
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
        # ok: KL006
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
