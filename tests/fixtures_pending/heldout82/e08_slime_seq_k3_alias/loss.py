# Reviewer: slime-style policy loss. Log-probs from log_probs.py, the KL from
# ppo_utils.compute_seq_kl re-exported as seq_kl (args.kl_loss_type default
# "low_var_kl"), the reduction from reductions.py; train_step backprops.
# Verdict: BUG, KL002. k3 of the SEQUENCE log-ratio, exp(-s) + s - 1, with
# gradient: expected gradient is grad KL(pi_ref||pi) of the sequence (the
# swapped divergence). Reported on the call of the helper from the loss.
from argparse import Namespace

import torch
from megatron.core import mpu

from . import get_sum_of_sample_mean, seq_kl
from .log_probs import calculate_log_probs_and_entropy


def policy_loss_function(args: Namespace, batch, logits):
    log_probs, entropy = calculate_log_probs_and_entropy(logits, batch["tokens"], with_entropy=True)
    loss_mask = batch["loss_mask"]
    n = log_probs.size(0)
    ppo_kl = batch["old_log_probs"] - log_probs
    ratio = (-ppo_kl).exp()
    adv = batch["advantages"]
    pg = torch.max(-ratio * adv, -ratio.clamp(1 - args.eps_clip, 1 + args.eps_clip_high) * adv)
    pg_loss = get_sum_of_sample_mean((pg * loss_mask).sum(-1), n)
    entropy_loss = get_sum_of_sample_mean((entropy * loss_mask).sum(-1), n)
    # ok: KL006
    loss = pg_loss - args.entropy_coef * entropy_loss
    if args.use_kl_loss:
        # error: KL002
        kl = seq_kl(log_probs, batch["ref_log_probs"], loss_mask, kl_loss_type=args.kl_loss_type)
        kl_loss = get_sum_of_sample_mean(kl, n)
        loss = loss + args.kl_loss_coef * kl_loss
    return loss, {"pg_loss": pg_loss.detach(), "entropy": entropy_loss.detach()}


def train_step(args, model, optimizer, data_iterator):
    batch = next(data_iterator)
    logits = model(batch["tokens_in"]).logits
    loss, log = policy_loss_function(args, batch, logits)
    loss.backward()
    if mpu.get_data_parallel_rank() == 0:
        print({k: v.item() for k, v in log.items()})
    optimizer.step()
    optimizer.zero_grad()
