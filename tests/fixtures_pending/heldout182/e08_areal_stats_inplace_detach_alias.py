# Reviewer: AReaL-style PPO actor loss. The statistics dict stores `logprobs`
# itself (no copy), and a loop then calls `v.detach_()` on every stats value
# "so the stats do not keep the graph alive". `detach_()` works in place on
# the tensor object, so it detaches the caller's `logprobs` too. The PPO term
# was already built (its graph still holds the old history and trains), but the
# KL computed afterwards from `logprobs` has no gradient: the sequence k2,
# right as an estimator, is a constant added to the loss.
# Verdict: bug, KL005, reported on the `kl = 0.5 * seq_log_ratio ...` line
# (the estimate is computed only from detached log-probs and added to the loss).
from dataclasses import dataclass
from typing import Dict

import torch

from areal.api.cli_args import PPOActorConfig
from areal.utils.data import split_padded_tensor_dict_into_mb_list


@dataclass
class KLActorConfig:
    eps_clip: float = 0.2
    kl_ctl: float = 0.02
    c_clip: float = 3.0


def _detach_stats_(stats: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    for v in stats.values():
        v.detach_()
    return stats


def ppo_actor_loss_fn(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    cfg: KLActorConfig,
):
    """logprobs: [B, T] from the engine's gather_logprobs (not a view), with grad."""
    ratio = torch.exp(logprobs - old_logprobs)
    clipped_ratio = torch.clamp(ratio, 1.0 - cfg.eps_clip, 1.0 + cfg.eps_clip)
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * clipped_ratio
    pg_loss = torch.max(pg_loss1, pg_loss2)
    dual_clip = torch.min(pg_loss, -advantages * cfg.c_clip)
    pg_loss = torch.where(advantages < 0, dual_clip, pg_loss)
    pg_loss = (pg_loss * loss_mask).sum(-1).mean()

    stats = _detach_stats_(
        dict(
            logprobs=logprobs,
            old_logprobs=old_logprobs,
            clip_mask=(pg_loss1 < pg_loss2).to(logprobs.dtype),
        )
    )

    seq_log_ratio = ((logprobs - ref_logprobs) * loss_mask).sum(-1)
    # error: KL005
    kl = 0.5 * seq_log_ratio.square()
    loss = pg_loss + cfg.kl_ctl * kl.mean()
    stats["kl"] = kl.detach()
    return loss, stats


def ppo_update(engine, cfg: KLActorConfig, data: Dict[str, torch.Tensor], mb_spec):
    all_stats = []
    for mb in split_padded_tensor_dict_into_mb_list(data, mb_spec):
        logprobs = engine.forward_logprobs(mb)
        loss, stats = ppo_actor_loss_fn(
            logprobs, mb["logprobs"], mb["ref_logp"], mb["advantages"], mb["loss_mask"], cfg
        )
        engine.backward(loss)
        all_stats.append({k: v.float().mean().item() for k, v in stats.items()})
    engine.step()
    return all_stats
