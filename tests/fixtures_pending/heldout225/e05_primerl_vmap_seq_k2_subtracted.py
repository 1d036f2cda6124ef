# Reviewer: prime-rl-style trainer loss written per sample and batched with
# `torch.func.vmap`. `_sample_loss` sees one response ([T] tensors): a clipped
# importance-sampled policy term and a KL term that is k2 of the SEQUENCE
# log-ratio, `0.5 * ((logp - ref) * mask).sum() ** 2` (a correct estimator).
# But the sample loss returns `pg - kl_coef * kl`: the penalty is subtracted
# from a loss that is minimised (compute_loss -> loss.backward()), so with the
# default LossConfig (kl_coef=0.02) training increases KL(pi||pi_ref).
# Verdict: bug, KL006, reported inside _sample_loss on the k2 line (a loss
# helper of this file, called from one place, that negates the penalty).
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor
from torch.func import vmap

from prime_rl.trainer.model import forward
from prime_rl.trainer.world import get_world


@dataclass(frozen=True)
class LossConfig:
    mask_ratio_low: float = 0.125
    mask_ratio_high: float = 8.0
    kl_coef: float = 0.02
    normalize_by: str = "samples"


def _sample_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    ref_logprobs: Tensor,
    advantage: Tensor,
    loss_mask: Tensor,
    *,
    cfg: LossConfig,
) -> Tensor:
    log_ratio = logprobs - old_logprobs
    ratio = log_ratio.exp()
    keep = ((ratio > cfg.mask_ratio_low) & (ratio < cfg.mask_ratio_high)).to(logprobs.dtype)
    pg = -(ratio * advantage * keep * loss_mask).sum()
    # error: KL006
    kl = 0.5 * (logprobs - ref_logprobs).mul(loss_mask).sum().square()
    return pg - cfg.kl_coef * kl


def compute_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    ref_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    loss_config: LossConfig = LossConfig(),
) -> tuple[Tensor, dict[str, Tensor]]:
    per_sample = vmap(partial(_sample_loss, cfg=loss_config))(
        logprobs, old_logprobs, ref_logprobs, advantages, loss_mask
    )
    if loss_config.normalize_by == "samples":
        loss = per_sample.mean()
    else:
        loss = per_sample.sum() / loss_mask.sum().clamp_min(1.0)
    with torch.no_grad():
        mismatch_kl = ((logprobs - old_logprobs) * loss_mask).sum() / loss_mask.sum()
    return loss, {"loss": loss.detach(), "mismatch_kl": mismatch_kl}


def selective_log_softmax(logits: Tensor, ids: Tensor, temperature: float = 1.0) -> Tensor:
    return (logits / temperature).log_softmax(-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)


def train_step(model, optimizer, micro_batches, *, loss_config: LossConfig = LossConfig(), temperature: float = 1.0):
    world = get_world()
    model.train()
    metrics: dict[str, float] = {}
    for mb in micro_batches:
        logits = forward(model, mb["input_ids"], mb["position_ids"])
        logprobs = selective_log_softmax(logits[:, :-1], mb["input_ids"][:, 1:], temperature)
        loss, info = compute_loss(
            logprobs,
            mb["inference_logprobs"],
            mb["ref_logprobs"],
            mb["advantages"],
            mb["loss_mask"],
            loss_config=loss_config,
        )
        (loss / len(micro_batches)).backward()
        for k, v in info.items():
            metrics[k] = metrics.get(k, 0.0) + v.item() / len(micro_batches)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad()
    metrics["rank"] = float(world.rank)
    return metrics
