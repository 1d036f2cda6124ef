# Reviewer: open-instruct-style grpo_fast learner, same skeleton as e06
# (kl_estimate 1-4, the four KLs logged under no_grad, constant
# masked_mean_denominator). This fork adds `sequence_level_kl=True`: the masked
# log-probs are summed over the response BEFORE the estimator is applied, and the
# default kl_estimator = 2 gives 0.5 * (sum_t logr_t)^2 per sequence, whose
# gradient is exactly grad KL(pi||pi_ref) of the sequence.
# Verdict: correct. The k2 call is on sequence log-probs, not per token.
from dataclasses import dataclass
from typing import Optional

import torch

from open_instruct.model_utils import log_softmax_and_gather
from open_instruct.rl_utils import masked_mean as _upstream_masked_mean


@dataclass
class Args:
    beta: float = 0.05
    kl_estimator: int = 2
    sequence_level_kl: bool = True
    clip_lower: float = 0.2
    clip_higher: float = 0.2
    masked_mean_denominator: Optional[float] = 512.0


def masked_mean(values, mask, axis=None, denominator=None):
    numerator = (values * mask).sum(axis=axis)
    return numerator / (mask.sum(axis=axis) if denominator is None else denominator)


def kl_estimate(new_logprobs, ref_logprobs, ratio, kl_estimator):
    if kl_estimator == 1:
        kl = new_logprobs - ref_logprobs
    elif kl_estimator == 2:
        kl = (new_logprobs - ref_logprobs) ** 2 / 2
    elif kl_estimator == 3:
        kl = torch.expm1(ref_logprobs - new_logprobs) + (new_logprobs - ref_logprobs)
    elif kl_estimator == 4:
        kl = ratio * (torch.expm1(ref_logprobs - new_logprobs) + (new_logprobs - ref_logprobs))
    else:
        raise ValueError(f"kl_estimator must be 1-4, got {kl_estimator}")
    return kl


def grpo_fast_loss(args: Args, new_logprobs, old_logprobs, ref_logprobs, advantages, response_mask):
    logprobs_diff = new_logprobs - old_logprobs
    ratio = torch.exp(logprobs_diff)
    pg_losses = -advantages[:, None] * ratio
    pg_losses2 = -advantages[:, None] * torch.clamp(ratio, 1.0 - args.clip_lower, 1.0 + args.clip_higher)
    pg_loss_max = torch.max(pg_losses, pg_losses2)

    with torch.no_grad():
        # ok: KL005
        kl1 = new_logprobs - ref_logprobs
        kl_4BT = torch.stack([kl1, kl1**2 / 2, torch.expm1(-kl1) + kl1, ratio * (torch.expm1(-kl1) + kl1)])
        kl_stats = {f"kl{i + 1}": masked_mean(kl_4BT[i], response_mask).item() for i in range(4)}

    pg_loss = masked_mean(pg_loss_max, response_mask, denominator=args.masked_mean_denominator)
    seq_new = (new_logprobs * response_mask).sum(-1)
    seq_ref = (ref_logprobs * response_mask).sum(-1)
    seq_ratio = torch.exp(seq_new - seq_new.detach())
    # ok: KL003
    kl = kl_estimate(seq_new, seq_ref, seq_ratio, args.kl_estimator)
    loss = pg_loss + args.beta * kl.mean() / args.masked_mean_denominator
    stats = {"policy_loss": masked_mean(pg_loss_max, response_mask).item(), **kl_stats}
    return loss, stats


def train_step(args, model, optimizer, batch):
    new_logprobs = log_softmax_and_gather(model(batch["query_responses"]).logits[:, :-1], batch["query_responses"][:, 1:])
    new_logprobs = new_logprobs[:, -batch["response_mask"].shape[1]:]
    loss, stats = grpo_fast_loss(
        args, new_logprobs, batch["old_logprobs"], batch["ref_logprobs"], batch["advantages"], batch["response_mask"]
    )
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return stats
