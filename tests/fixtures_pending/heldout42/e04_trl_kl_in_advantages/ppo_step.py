# Reviewer: part of e04_trl_kl_in_advantages (see __init__.py): minimises the clipped surrogate on
# those advantages.
"""One PPO optimisation step on a minibatch."""

from dataclasses import dataclass

import torch

from .advantages import AdvantageConfig, compute_advantages


@dataclass
class PPOStepConfig:
    cliprange: float = 0.2
    cliprange_value: float = 0.2
    vf_coef: float = 0.1


def ppo_step(accelerator, optimizer, batch, new_logprobs, vpred, adv_cfg: AdvantageConfig, cfg: PPOStepConfig):
    mask = batch["response_mask"]
    advantages, returns, kl_stat = compute_advantages(
        batch["scores"], batch["values"], batch["logprobs"], batch["ref_logprobs"], mask, adv_cfg
    )
    ratio = torch.exp(new_logprobs - batch["logprobs"])
    pg_losses = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1.0 - cfg.cliprange, 1.0 + cfg.cliprange)
    pg_loss = (torch.max(pg_losses, pg_losses2) * mask).sum(1).mean()

    vpredclipped = batch["values"] + torch.clamp(vpred - batch["values"], -cfg.cliprange_value, cfg.cliprange_value)
    vf_losses = torch.max((vpred - returns) ** 2, (vpredclipped - returns) ** 2)
    vf_loss = 0.5 * (vf_losses * mask).sum() / mask.sum()

    loss = pg_loss + cfg.vf_coef * vf_loss
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    return {"loss/policy": pg_loss.item(), "loss/value": vf_loss.item(), "objective/kl": kl_stat.item()}
