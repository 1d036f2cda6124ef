# Reviewer: prime-rl-style loss assembled from terms written as objectives and
# turned into losses by @negate (a functools.wraps decorator returning -fn(...)).
# @negate is right on pg_objective (maximised), but it was copied onto
# kl_penalty too, which already returns the penalty 0.5 * (sum_t logr_t)^2
# (k2 of the sequence log-ratio, a correct estimator). compute_loss adds
# beta * kl_penalty(...), i.e. -beta * k2: descent increases KL(pi||pi_ref).
# Verdict: bug, KL006, reported where compute_loss calls the negated kl_penalty.
import functools
from dataclasses import dataclass

import torch

from prime_rl.trainer.model import get_logprobs
from prime_rl.utils.logger import get_logger


def negate(fn):
    """Turn an objective (to maximise) into a loss (to minimise)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return -fn(*args, **kwargs)

    return wrapper


@dataclass
class LossConfig:
    kl_beta: float = 0.05
    mask_ratio_high: float = 8.0
    max_tokens: int = 2048


@negate
def pg_objective(logprobs, old_logprobs, advantages, loss_mask, max_tokens):
    importance_ratio = torch.exp(logprobs - old_logprobs)
    keep = (importance_ratio.detach() < 8.0).float()
    return (importance_ratio * advantages.unsqueeze(-1) * loss_mask * keep).sum() / max_tokens


@negate
def kl_penalty(logprobs, ref_logprobs, loss_mask):
    seq_log_ratio = ((logprobs - ref_logprobs) * loss_mask).sum(-1)
    return 0.5 * seq_log_ratio.pow(2).mean()


def compute_loss(logprobs, old_logprobs, ref_logprobs, advantages, loss_mask, config: LossConfig):
    pg_loss = pg_objective(logprobs, old_logprobs, advantages, loss_mask, config.max_tokens)
    # error: KL006
    kl = kl_penalty(logprobs, ref_logprobs, loss_mask)
    loss = pg_loss + config.kl_beta * kl
    return loss, {"pg_loss": pg_loss.detach(), "kl": kl.detach()}


def train_step(model, batch, optimizer, config: LossConfig):
    logger = get_logger()
    logprobs = get_logprobs(model, batch["input_ids"], batch["position_ids"], batch["temperature"])
    loss, metrics = compute_loss(
        logprobs,
        batch["old_logprobs"],
        batch["ref_logprobs"],
        batch["advantages"],
        batch["loss_mask"],
        config,
    )
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    logger.debug(f"loss={loss.item():.4f} kl={metrics['kl'].item():.4f}")
    return metrics
