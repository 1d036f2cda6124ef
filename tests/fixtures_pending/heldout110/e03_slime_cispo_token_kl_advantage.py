# Reviewer: slime-style CISPO. Rollout samples are lists of 1-D tensors (one
# per response, no padding). Advantages are the group-normalised reward
# broadcast over each response, with a per-token KL penalty folded in
# (`kl_coef * (rollout_log_prob - ref_log_prob)`). The CISPO loss weights each
# token's log-prob by the clipped, detached importance weight times its
# advantage.
# Verdict: BUG (KL003). The KL penalty of token t enters the advantage of token
# t only (no reward-to-go over later tokens): the expected gradient is the
# token-level partial gradient of KL(pi||pi_ref), not that of the sequence.
import torch
import torch.distributed as dist  # noqa: F401
from slime.utils.types import Sample  # noqa: F401


def get_grpo_returns(rewards, kl, kl_coef):
    """rewards: list of scalars (already group-normalised); kl: list of [len_i] tensors."""
    returns = []
    for r, k in zip(rewards, kl):
        returns.append(torch.ones_like(k) * r - kl_coef * k)
    return returns


def compute_advantages(args, rewards, rollout_log_probs, ref_log_probs):
    with torch.no_grad():
        # error: KL003
        kl = [lp - rlp for lp, rlp in zip(rollout_log_probs, ref_log_probs)]
        advantages = get_grpo_returns(rewards, kl, args.kl_coef)
    return advantages


def cispo_loss(args, log_probs, old_log_probs, advantages):
    """All arguments are lists of [len_i] tensors; returns the summed loss and metrics."""
    log_probs = torch.cat(log_probs)
    old_log_probs = torch.cat(old_log_probs)
    advantages = torch.cat(advantages)
    ratio = torch.exp(log_probs - old_log_probs)
    # CISPO: clip the IS weight, never the token's gradient
    is_weight = torch.clamp(ratio, max=1.0 + args.eps_clip_high).detach()
    pg_loss = -(is_weight * advantages * log_probs)
    clipfrac = (ratio > 1.0 + args.eps_clip_high).float().mean()
    # token-sum with a constant normaliser (args.global_batch_tokens)
    loss = pg_loss.sum() / args.global_batch_tokens
    return loss, {"pg_loss": loss.detach(), "pg_clipfrac": clipfrac.detach()}


def train_step(args, model, optimizer, rollout):
    advantages = compute_advantages(
        args, rollout["rewards"], rollout["rollout_log_probs"], rollout["ref_log_probs"]
    )
    optimizer.zero_grad()
    log_probs = model.get_log_probs(rollout["tokens"], rollout["response_lengths"])
    loss, metrics = cispo_loss(args, log_probs, rollout["rollout_log_probs"], advantages)
    loss.backward()
    optimizer.step()
    return metrics
