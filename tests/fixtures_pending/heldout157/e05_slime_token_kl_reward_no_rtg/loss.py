# Part of e05 (see __init__.py). PPO loss and the step that backpropagates it.
import torch

from slime.backends.megatron_utils import get_log_probs

from . import advantages as adv_mod
from .rewards import compute_kl_rewards


def policy_loss_function(log_probs, old_log_probs, advantages, loss_mask, eps_clip=0.2, eps_clip_high=0.28):
    ppo_kl = old_log_probs - log_probs
    ratio = (-ppo_kl).exp()
    pg_losses1 = -ratio * advantages
    pg_losses2 = -ratio.clamp(1 - eps_clip, 1 + eps_clip_high) * advantages
    pg_losses = torch.maximum(pg_losses1, pg_losses2)
    return (pg_losses * loss_mask).sum(-1).mean()


def train_step(model, optimizer, batch):
    log_probs = get_log_probs(model, batch["tokens"], batch["response_lengths"])
    kl_rewards = compute_kl_rewards(batch["log_probs"], batch["ref_log_probs"], batch["loss_mask"])
    advantages = adv_mod.compute_token_advantages(kl_rewards, batch["rewards"], batch["loss_mask"])
    loss = policy_loss_function(log_probs, batch["log_probs"], advantages, batch["loss_mask"])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return {"loss": loss.item(), **adv_mod.advantage_stats(advantages, batch["loss_mask"])}
