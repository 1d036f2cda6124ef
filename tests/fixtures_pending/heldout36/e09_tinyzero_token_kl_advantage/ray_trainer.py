from pathlib import Path

import torch
import yaml

from .core_algos import apply_kl_to_advantage, compute_grpo_outcome_advantage

CONFIG = yaml.safe_load((Path(__file__).parent / "config" / "grpo_trainer.yaml").read_text())


@torch.no_grad()
def compute_advantage(batch, cfg=CONFIG):
    algo = cfg["algorithm"]
    adv = compute_grpo_outcome_advantage(batch["token_level_scores"], batch["response_mask"], batch["uid"])
    if algo["kl_in_advantage"]:
        adv = apply_kl_to_advantage(adv, batch["old_log_probs"], batch["ref_log_prob"], batch["response_mask"], algo["kl_coef"])
    batch["advantages"] = adv
    return batch


def update_actor(actor, optimizer, batch, clip_ratio=0.2):
    log_prob = actor.compute_log_prob(batch)
    ratio = torch.exp(log_prob - batch["old_log_probs"])
    adv = batch["advantages"]
    pg_losses = torch.max(-adv * ratio, -adv * torch.clamp(ratio, 1 - clip_ratio, 1 + clip_ratio))
    loss = (pg_losses * batch["response_mask"]).sum(-1).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()
