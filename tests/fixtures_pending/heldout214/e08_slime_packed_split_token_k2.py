# Reviewer: slime-style loss on PACKED sequences: the log-probs of all responses
# are one flat tensor, response lengths come out of torch with .tolist(), the
# flat tensors are cut with torch.split, and each sample's KL is computed in a
# Python loop and joined with torch.stack (which keeps the gradient). Each
# sample's KL is 0.5 * sum_t logr_t^2: k2 per TOKEN, then summed over the
# sample's tokens. Its gradient keeps only logr_t * grad logp_t for each token,
# the token-level partial gradient of the sequence KL(pi||pi_ref).
# Verdict: bug, KL003, reported on the per-sample k2 line.
from argparse import Namespace

import torch

from slime.backends.megatron_utils.cp_utils import get_sum_of_sample_mean
from slime.utils.ppo_utils import compute_policy_loss

DEFAULT_ARGS = Namespace(kl_loss_coef=0.02, eps_clip=0.2, eps_clip_high=0.28, use_kl_loss=True)


def policy_loss_function(args, log_probs, old_log_probs, ref_log_probs, advantages, response_lengths):
    """All tensors are packed: shape [sum(response_lengths)]."""
    args = args or DEFAULT_ARGS
    ratio = (log_probs - old_log_probs).exp()
    pg = -torch.minimum(ratio * advantages, ratio.clamp(1 - args.eps_clip, 1 + args.eps_clip_high) * advantages)
    lengths = response_lengths.tolist() if torch.is_tensor(response_lengths) else list(response_lengths)
    pg_loss = torch.stack([chunk.sum() for chunk in torch.split(pg, lengths)]).mean()

    loss = pg_loss
    reported = {"pg_loss": pg_loss.detach()}
    if args.use_kl_loss:
        kl_terms = []
        for lp, ref in zip(torch.split(log_probs, lengths), torch.split(ref_log_probs, lengths)):
            # ok: KL001
            lr = lp - ref
            # error: KL003
            kl_terms.append(0.5 * lr.pow(2).sum())
        kl_loss = torch.stack(kl_terms).mean()
        loss = loss + args.kl_loss_coef * kl_loss
        reported["kl_loss"] = kl_loss.detach()
        reported["kl_per_sample"] = [t.item() for t in kl_terms]
    return loss, reported


def train_one_step(model, batch, args=None):
    log_probs = model.forward_packed(batch["tokens"], batch["cu_seqlens"])
    loss, reported = policy_loss_function(
        args,
        log_probs,
        batch["log_probs"],
        batch["ref_log_probs"],
        batch["advantages"],
        batch["response_lengths"],
    )
    loss.backward()
    return {k: (v.item() if torch.is_tensor(v) else v) for k, v in reported.items()}
