# Reviewer: prime-rl style RL loss (importance-sampled policy gradient with a
# masked token-level ratio, as in prime_rl.trainer.rl.loss). A KL penalty to the
# reference model was added, but the k3 estimate is built from
# `inference_logprobs` (the vLLM sampler's log-probs, returned with the rollout
# and carrying no gradient) and the reference log-probs: no term of it depends on
# the trained `logprobs`. It is added to the loss as a penalty, so it is printed
# in the logs and contributes exactly zero gradient.
# Verdict: BUG, KL005 (KL loss without gradient), reported on the k3 line.
# Checked: expected gradient of the KL part is exactly 0 (see README).
from dataclasses import dataclass

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from prime_rl.trainer.rl.config import LossConfigBase
from prime_rl.utils.logger import get_logger


@dataclass
class LossConfig(LossConfigBase):
    mask_ratio_low: float = 0.125
    mask_ratio_high: float = 8.0
    kl_tau: float = 0.05
    ratio_type: str = "token"


def selective_log_softmax(logits: Tensor, index: Tensor) -> Tensor:
    return torch.gather(logits.log_softmax(-1), -1, index.unsqueeze(-1)).squeeze(-1)


def compute_loss(
    logprobs: Float[Tensor, "batch seq"],
    inference_logprobs: Float[Tensor, "batch seq"],
    ref_logprobs: Float[Tensor, "batch seq"],
    advantages: Float[Tensor, "batch"],
    loss_mask: Bool[Tensor, "batch seq"],
    loss_config: LossConfig,
    loss_scale: int,
) -> tuple[Tensor, dict[str, Tensor]]:
    loss_mask = loss_mask.float()
    # ok: KL001
    log_importance_ratio = logprobs - inference_logprobs
    importance_ratio = torch.exp(log_importance_ratio)
    is_masked = (importance_ratio < loss_config.mask_ratio_low) | (importance_ratio > loss_config.mask_ratio_high)
    keep = loss_mask * (~is_masked).float()

    pg_loss = -(importance_ratio * advantages.unsqueeze(-1) * keep).sum()

    # KL to the reference, k3 ("low variance") form, per token
    ref_log_ratio = ref_logprobs - inference_logprobs
    # error: KL005
    kl = torch.exp(ref_log_ratio) - ref_log_ratio - 1
    kl_loss = (kl * loss_mask).sum()

    loss = (pg_loss + loss_config.kl_tau * kl_loss) / loss_scale

    metrics = {
        "pg_loss": pg_loss.detach() / loss_scale,
        "kl": (kl * loss_mask).sum().detach() / loss_mask.sum().clamp(min=1),
        "is_masked_frac": (is_masked.float() * loss_mask).sum() / loss_mask.sum().clamp(min=1),
    }
    return loss, metrics


def train_micro_batches(model, ref_logprobs_fn, micro_batches, optimizer, loss_config: LossConfig):
    logger = get_logger()
    total_tokens = sum(int(mb["loss_mask"].sum()) for mb in micro_batches)
    optimizer.zero_grad()
    for mb in micro_batches:
        logits = model(input_ids=mb["input_ids"], position_ids=mb["position_ids"]).logits
        logprobs = selective_log_softmax(logits[:, :-1], mb["input_ids"][:, 1:])
        with torch.no_grad():
            ref_logprobs = ref_logprobs_fn(mb)
        loss, metrics = compute_loss(
            logprobs,
            mb["inference_logprobs"],
            ref_logprobs,
            mb["advantages"],
            mb["loss_mask"],
            loss_config,
            total_tokens,
        )
        loss.backward()
        logger.debug(f"micro-batch loss {loss.item():.4f} kl {metrics['kl'].item():.4f}")
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
