# Reviewer: slime-style policy loss. A torch port of
# scipy.signal.lfilter([1], [1, -gamma], x[::-1])[::-1] (the discounted reverse
# cumulative sum) is written with F.conv1d and a gamma ** arange kernel; with the
# default kl_gamma = 1 its column 0 is the whole response's log-ratio, and the KL
# loss is k2 of it, 0.5 * L**2 - the right estimator. But L is built from
# batch["log_probs"], the log-probs recorded by the rollout engine (no
# gradient), not from the fresh log_probs of this forward pass: the KL loss is
# a constant for autograd, gradient exactly zero.
# Verdict: bug, KL005, reported on the line that computes the k2 estimate.
from argparse import Namespace

import torch
import torch.nn.functional as F

from slime.backends.megatron_utils.loss import get_log_probs_and_entropy
from slime.utils.ppo_utils import compute_approx_kl


def discounted_cumsum(x: torch.Tensor, gamma: float) -> torch.Tensor:
    """y_t = sum_k gamma**k * x_{t+k} along the last axis (lfilter, reversed)."""
    T = x.size(-1)
    kernel = gamma ** torch.arange(T, dtype=x.dtype, device=x.device)
    padded = F.pad(x, (0, T - 1)).unsqueeze(1)
    return F.conv1d(padded, kernel.view(1, 1, T)).squeeze(1)


def policy_loss_function(args: Namespace, batch: dict, log_probs: torch.Tensor):
    old_log_probs = batch["log_probs"]
    ref_log_probs = batch["ref_log_probs"]
    advantages = batch["advantages"]
    loss_masks = batch["loss_masks"]

    ppo_kl = old_log_probs - log_probs
    ratio = (-ppo_kl).exp()
    pg_losses1 = -ratio * advantages
    pg_losses2 = -ratio.clamp(1 - args.eps_clip, 1 + args.eps_clip_high) * advantages
    pg_loss = (torch.maximum(pg_losses1, pg_losses2) * loss_masks).sum(-1).mean()

    loss = pg_loss
    log = {"pg_loss": pg_loss.detach()}
    if args.use_kl_loss:
        log_ratio = (old_log_probs - ref_log_probs) * loss_masks
        seq_log_ratio = discounted_cumsum(log_ratio, args.kl_gamma)[:, 0]
        # error: KL005
        kl = 0.5 * seq_log_ratio**2
        kl_loss = kl.mean()
        loss = loss + args.kl_loss_coef * kl_loss
        log["kl_loss"] = kl_loss.detach()
    log["ppo_kl"] = (ppo_kl * loss_masks).sum(-1).mean().detach()
    return loss, log


def default_args() -> Namespace:
    return Namespace(eps_clip=0.2, eps_clip_high=0.28, use_kl_loss=True, kl_gamma=1.0, kl_loss_coef=0.01)


def train_micro_batch(model, batch, args=None):
    args = args or default_args()
    logits = model(batch["tokens"])
    log_probs, _ = get_log_probs_and_entropy(logits, batch["tokens"], batch["response_lengths"])
    loss, log = policy_loss_function(args, batch, log_probs)
    loss.backward()
    return log
