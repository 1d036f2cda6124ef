# Reviewer: slime-style policy loss for a batch mixing fresh rollouts
# (`is_on_policy`) with replay rows from older weights. To save a recompute, the
# KL to the reference takes the inference engine's `rollout_log_probs` on the
# fresh rows ("same weights") and the trainer's log-probs elsewhere, then keeps
# the fresh rows only. The estimator (k2 of the sequence log-ratio) would be
# right, but every log-prob that reaches the KL loss is a stored, gradient-free
# rollout log-prob: the KL term has zero gradient and regularises nothing.
# Verdict: bug, KL005, reported on the `seq_kl = ...` line (the estimate).
from argparse import Namespace

import torch

from slime.backends.megatron_utils.cp_utils import get_sum_of_sample_mean
from slime.utils.ppo_utils import compute_policy_loss


def mixed_policy_loss_function(args: Namespace, batch: dict, log_probs: torch.Tensor):
    rollout_log_probs = batch["rollout_log_probs"]
    ref_log_probs = batch["ref_log_probs"]
    loss_masks = batch["loss_masks"].to(log_probs.dtype)
    advantages = batch["advantages"]
    is_on_policy = batch["is_on_policy"]
    on = is_on_policy.to(log_probs.dtype)

    # truncated importance sampling against the behaviour (rollout) log-probs, both sources
    ppo_kl = rollout_log_probs - log_probs
    ratio = torch.exp(-ppo_kl)
    clipped = ratio.clamp(1 - args.eps_clip, 1 + args.eps_clip_high)
    pg = torch.max(-ratio * advantages, -clipped * advantages)
    pg_loss = (pg * loss_masks).sum(-1).mean()

    # rollout log-probs of fresh rows come from the current weights: reuse them for the KL
    kl_log_probs = torch.where(is_on_policy.unsqueeze(-1), rollout_log_probs, log_probs)
    # error: KL005
    seq_kl = 0.5 * (((kl_log_probs - ref_log_probs) * loss_masks).sum(-1)) ** 2
    kl_loss = (seq_kl * on).sum() / on.sum().clamp(min=1.0)

    loss = pg_loss
    if args.use_kl_loss:
        loss = loss + args.kl_loss_coef * kl_loss

    reported = {
        "loss": loss.clone().detach(),
        "pg_loss": pg_loss.clone().detach(),
        "kl_loss": kl_loss.clone().detach(),
        "replay_frac": (1 - on).mean().detach(),
    }
    return loss, reported


def default_args():
    return Namespace(eps_clip=0.2, eps_clip_high=0.28, use_kl_loss=True, kl_loss_coef=0.1)
