# Reviewer: AReaL-style loss for fictitious self-play. The learner plays against a pool
# of frozen snapshots of itself; the KL anchor is the opponent snapshot of the current
# match (its logits come in the batch, computed by the snapshot engine). A private
# helper `_snapshot_kl`, called from one place and given only logits, forms both
# models' token log-probs and returns the per-sequence sum of the log-ratio, which the
# loss adds with gradient (AReaL-style: labels are `torch.roll(input_ids, -1)`).
# Verdict: bug, KL001. The helper differentiates the k1 estimate: its expected
# gradient is E[sum_t grad logp_t] = 0. The anchor to the snapshot pool is a no-op.
import torch
from areal.utils.functional import masked_normalization


def _gather_logprobs(logits, labels, temperature):
    log_probs = torch.log_softmax(logits.float() / temperature, dim=-1)
    return log_probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def _snapshot_kl(logits, snapshot_logits, input_ids, loss_mask, temperature):
    labels = torch.roll(input_ids, shifts=-1, dims=-1)
    logprobs = _gather_logprobs(logits, labels, temperature)
    with torch.no_grad():
        snap_logprobs = _gather_logprobs(snapshot_logits, labels, temperature)
    # error: KL001
    kl = (logprobs - snap_logprobs) * loss_mask
    return kl.sum(-1), logprobs


def fsp_grpo_loss_fn(logits, input_data, temperature=1.0, eps_clip=0.2, kl_ctl=0.05):
    input_ids = input_data["input_ids"]
    loss_mask = input_data["loss_mask"].float()
    old_logp = input_data["logprobs"]
    advantages = input_data["advantages"]

    seq_kl, logprobs = _snapshot_kl(logits, input_data["snapshot_logits"], input_ids, loss_mask, temperature)

    ratio = torch.exp(logprobs - old_logp)
    clipped = torch.clamp(ratio, 1.0 - eps_clip, 1.0 + eps_clip)
    pg = -torch.min(ratio * advantages, clipped * advantages)
    n_tokens = loss_mask.sum().clamp(min=1.0)
    pg_loss = (pg * loss_mask).sum() / n_tokens

    loss = pg_loss + kl_ctl * seq_kl.mean()
    stats = dict(
        pg_loss=pg_loss.detach(),
        snapshot_kl=seq_kl.detach().mean(),
        clip_frac=((ratio - clipped).abs() > 0).float().mul(loss_mask).sum() / n_tokens,
    )
    return loss, stats


def normalise_match_advantages(rewards, match_ids):
    # per-match normalisation of the win/loss signal across the two seats
    return masked_normalization(rewards, group_ids=match_ids)
