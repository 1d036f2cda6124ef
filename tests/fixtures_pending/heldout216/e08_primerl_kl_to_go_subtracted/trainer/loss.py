"""Importance-sampled policy loss with a KL-to-reference term."""

from dataclasses import dataclass

import torch
from jaxtyping import Float  # noqa: F401

from ..utils import kl_to_go, masked_mean, masked_sum


@dataclass
class LossConfig:
    mask_ratio_high: float = 8.0
    kl_coef: float = 0.1


def compute_loss(logprobs, old_logprobs, ref_logprobs, advantages, loss_mask, config: LossConfig):
    """Per-sequence token-sum losses, averaged over the micro batch."""
    log_importance_ratio = logprobs - old_logprobs
    importance_ratio = torch.exp(log_importance_ratio)
    is_masked = importance_ratio.detach() > config.mask_ratio_high
    keep = loss_mask * (~is_masked).float()
    pg_loss = -masked_sum(importance_ratio * advantages.unsqueeze(-1), keep).mean()

    weights = kl_to_go(logprobs, ref_logprobs, loss_mask)
    # error: KL006
    kl_penalty = masked_sum(weights * logprobs, loss_mask).mean()
    loss = pg_loss - config.kl_coef * kl_penalty

    metrics = {
        "pg_loss": pg_loss.detach(),
        "kl_to_ref": masked_sum(weights[..., :1], loss_mask[..., :1]).mean(),
        "masked_frac": masked_mean(is_masked.float(), loss_mask).mean(),
    }
    return loss, metrics


def train_step(model, optimizer, batch, config: LossConfig = LossConfig()):
    logprobs = model.compute_logprobs(batch["input_ids"], batch["position_ids"])
    loss, metrics = compute_loss(
        logprobs,
        batch["old_logprobs"],
        batch["ref_logprobs"],
        batch["advantages"],
        batch["loss_mask"],
        config,
    )
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return {k: float(v) for k, v in metrics.items()}
