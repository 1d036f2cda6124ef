"""A torchtune-style PPO/GRPO recipe whose KL mode is an Enum defaulting to FULL_VOCAB:
at every position of the *sampled* response it computes the exact KL(pi||pi_ref) over the
whole vocabulary and sums it over positions as a loss.  Each position's term has the right
gradient for that position, but the sum is only the token-level partial gradient of the
sequence KL(pi||pi_ref), because prefixes are drawn from pi and later positions' KL is not
credited to earlier tokens (KL003, at the full-vocabulary line).
"""
from dataclasses import dataclass
from enum import Enum

import torch
import torch.nn.functional as F


class KLMode(Enum):
    SAMPLED_K1 = "k1"
    FULL_VOCAB = "full"


@dataclass
class RecipeConfig:
    kl_mode: KLMode = KLMode.FULL_VOCAB
    kl_coeff: float = 0.1
    temperature: float = 1.0


def per_position_kl(policy_logits, ref_logits, response_ids, cfg: RecipeConfig):
    logp_all = F.log_softmax(policy_logits / cfg.temperature, dim=-1)
    ref_all = F.log_softmax(ref_logits / cfg.temperature, dim=-1)
    if cfg.kl_mode is KLMode.FULL_VOCAB:
        # error: KL003
        return (logp_all.exp() * (logp_all - ref_all)).sum(-1)
    lp = logp_all.gather(-1, response_ids[..., None]).squeeze(-1)
    rp = ref_all.gather(-1, response_ids[..., None]).squeeze(-1)
    # ok: KL005
    return (lp - rp).detach()


def recipe_loss(policy_logits, ref_logits, response_ids, padding_mask, advantages, cfg: RecipeConfig):
    logp = F.log_softmax(policy_logits, -1).gather(-1, response_ids[..., None]).squeeze(-1)
    pg = -(advantages[:, None] * logp * padding_mask).sum(-1)
    kl = (per_position_kl(policy_logits, ref_logits, response_ids, cfg) * padding_mask).sum(-1)
    return (pg + cfg.kl_coeff * kl).mean()


def train_step(accelerator, policy, ref_policy, batch, optimizer, cfg: RecipeConfig = RecipeConfig()):
    ids = batch["response_ids"]
    policy_logits = policy(ids).logits
    with torch.no_grad():
        ref_logits = ref_policy(ids).logits
    loss = recipe_loss(policy_logits, ref_logits, ids, batch["padding_mask"], batch["advantages"], cfg)
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    return loss.detach()
