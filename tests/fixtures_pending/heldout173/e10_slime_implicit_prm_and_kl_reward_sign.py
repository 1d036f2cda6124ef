# Reviewer: slime-style advantage module for PRIME-like training. An implicit
# process reward model (a separate model trained with a DPO-style
# cross-entropy on outcome labels) gives per-token process rewards
# prm_beta * (log pi_prm - log pi_prm_ref): a log-ratio of a different model
# against its own reference, detached, added to the rewards on purpose. The
# policy's own KL penalty is written with the log-ratio reversed,
# kl = ref_log_probs - log_probs, and then subtracted again, rewards -=
# kl_coef * kl: the two signs combine into +kl_coef * (logp - ref) per token, a
# KL BONUS. With reverse-cumsum returns the loss's expected gradient is
# -kl_coef * grad KL(pi||pi_ref) of the sequence: descent increases the KL.
# Verdict: bug, KL006, reported inside build_token_rewards on the `kl = ...` line.
from argparse import Namespace

import torch
import torch.nn.functional as F

from slime.utils.types import Sample
from slime.backends.megatron_utils.loss import get_log_probs_and_entropy


def implicit_prm_loss(prm_seq_logps, prm_ref_seq_logps, outcome_labels, prm_beta):
    """Cross-entropy of the implicit PRM on outcome labels (PRIME)."""
    # ok: KL001
    implicit_reward = prm_beta * (prm_seq_logps - prm_ref_seq_logps)
    return F.binary_cross_entropy_with_logits(implicit_reward, outcome_labels.float())


@torch.no_grad()
def build_token_rewards(args: Namespace, log_probs, ref_log_probs, prm_log_probs, prm_ref_log_probs, scores, loss_mask):
    # ok: KL006
    process_rewards = args.prm_beta * (prm_log_probs - prm_ref_log_probs) * loss_mask
    # error: KL006
    kl = ref_log_probs - log_probs
    rewards = process_rewards - args.kl_coef * kl * loss_mask
    last = loss_mask.sum(-1).long() - 1
    rewards[torch.arange(rewards.shape[0]), last] += scores
    return rewards


def get_returns(rewards: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    return (rewards * loss_mask).flip(-1).cumsum(-1).flip(-1)


def policy_loss(args: Namespace, log_probs, old_log_probs, returns, loss_mask):
    ratio = (log_probs - old_log_probs).exp()
    pg1 = -returns * ratio
    pg2 = -returns * ratio.clamp(1 - args.eps_clip, 1 + args.eps_clip_high)
    return (torch.max(pg1, pg2) * loss_mask).sum(-1).mean()


def compute_rl_loss(args: Namespace, log_probs, ref_log_probs, prm_log_probs, prm_ref_log_probs, scores, loss_mask):
    rewards = build_token_rewards(
        args, log_probs.detach(), ref_log_probs, prm_log_probs, prm_ref_log_probs, scores, loss_mask
    )
    returns = get_returns(rewards, loss_mask)
    return policy_loss(args, log_probs, log_probs.detach(), returns, loss_mask)


DEFAULT_ARGS = Namespace(prm_beta=0.05, kl_coef=0.02, eps_clip=0.2, eps_clip_high=0.28)


def train_step(model, ref_model, prm, prm_ref, batch, args: Namespace = DEFAULT_ARGS):
    log_probs = get_log_probs_and_entropy(model, batch)["log_probs"]
    with torch.no_grad():
        ref_log_probs = get_log_probs_and_entropy(ref_model, batch)["log_probs"]
        prm_log_probs = get_log_probs_and_entropy(prm, batch)["log_probs"]
        prm_ref_log_probs = get_log_probs_and_entropy(prm_ref, batch)["log_probs"]
    loss = compute_rl_loss(args, log_probs, ref_log_probs, prm_log_probs, prm_ref_log_probs, batch["scores"], batch["loss_mask"])
    loss.backward()
    return loss.detach()
