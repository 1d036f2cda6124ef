# Reviewer: verl-style actor loss for GRPO (dp_actor.update_policy calls it per
# micro-batch) with a "sequence-level k2" KL loss. The micro-batch arrives flat,
# [B*G, T]; it is viewed as [B, G, T] so the group-normalised advantages can be
# checked per prompt. The KL block was written for the flat layout, where
# `.sum(dim=1)` sums the log-ratio over the response. On [B, G, T], dim 1 is the
# GROUP axis: each entry is one position's log-ratio summed over the G samples of
# a prompt. Squaring it gives each token the weight x_t of its own token plus
# the same position's x of the other samples, which are independent of it and
# vanish in expectation: the token-level (partial) gradient of KL(pi||pi_ref),
# i.e. per-token k2 in disguise, not the k2 of the sequence log-ratio.
# Verdict: bug, KL003, reported on the k2 line (the estimate).
from dataclasses import dataclass

import torch

from verl.utils.torch_functional import masked_mean


@dataclass
class GroupActorConfig:
    rollout_n: int = 8
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28
    use_kl_loss: bool = True
    kl_loss_coef: float = 0.001


def compute_group_actor_loss(log_prob, old_log_prob, ref_log_prob, advantages, response_mask, config):
    n = config.rollout_n
    bsz = log_prob.shape[0] // n
    resp_len = log_prob.shape[-1]

    # [B*G, T] -> [B, G, T]: one row of samples per prompt
    log_prob = log_prob.view(bsz, n, resp_len)
    old_log_prob = old_log_prob.view(bsz, n, resp_len)
    ref_log_prob = ref_log_prob.view(bsz, n, resp_len)
    mask = response_mask.view(bsz, n, resp_len)
    adv = advantages.view(bsz, n, resp_len)

    negative_approx_kl = log_prob - old_log_prob
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -adv * ratio
    pg_losses2 = -adv * torch.clamp(ratio, 1 - config.clip_ratio_low, 1 + config.clip_ratio_high)
    pg_losses = torch.maximum(pg_losses1, pg_losses2)
    pg_loss = masked_mean(pg_losses, mask)
    pg_clipfrac = masked_mean(torch.gt(pg_losses2, pg_losses1).float(), mask)

    metrics = {
        "actor/pg_loss": pg_loss.detach().item(),
        "actor/pg_clipfrac": pg_clipfrac.detach().item(),
        "actor/ppo_kl": masked_mean(-negative_approx_kl, mask).detach().item(),
    }

    policy_loss = pg_loss
    if config.use_kl_loss:
        # ok: KL001
        log_ratio = (log_prob - ref_log_prob) * mask
        seq_log_ratio = log_ratio.sum(dim=1)  # sum over the response -> [bsz*n]
        # error: KL003
        kl = 0.5 * seq_log_ratio.pow(2)
        kl_loss = kl.mean()
        policy_loss = policy_loss + kl_loss * config.kl_loss_coef
        metrics["actor/kl_loss"] = kl_loss.detach().item()
        metrics["actor/kl_coef"] = config.kl_loss_coef

    return policy_loss, metrics
