# Reviewer: slime-style advantage computation for zero-sum self-play (one model plays
# both seats; every turn is a sample with its own variable-length tensors, as slime
# stores them). The per-token reward is the KL term against the reference plus the
# game outcome on the last token (negated for seat 1); returns are the reverse
# cumulative sum, and the policy loss weights each token's log-prob by its return.
# The KL reward is written `+ kl_coef * (log_probs - ref_log_probs)`: with the log-ratio
# in that order the plus sign makes it a bonus for moving away from the reference.
# Verdict: bug, KL006. The KL part of the minimised loss has expected gradient
# -kl_coef * grad KL(pi||pi_ref): the penalty is negated (the reward-to-go itself is
# correct, so the magnitude is exactly right and only the sign is wrong).
import torch
from slime.utils.types import RolloutBatch


def get_selfplay_returns(args, rollout_data: RolloutBatch):
    log_probs = rollout_data["log_probs"]          # list of [len_i] tensors, no grad
    ref_log_probs = rollout_data["ref_log_probs"]
    rewards = rollout_data["rewards"]              # seat-0 outcome of the game
    seats = rollout_data["seat"]

    returns_list = []
    for i in range(len(log_probs)):
        sign = 1.0 if seats[i] == 0 else -1.0
        # error: KL006
        token_rewards = args.kl_coef * (log_probs[i] - ref_log_probs[i])
        token_rewards[-1] += sign * rewards[i]
        returns = torch.flip(torch.cumsum(torch.flip(token_rewards, dims=[0]), dim=0), dims=[0])
        returns_list.append(returns)
    rollout_data["returns"] = returns_list
    rollout_data["advantages"] = returns_list
    return rollout_data


def selfplay_policy_loss(args, log_probs, old_log_probs, advantages, loss_masks):
    """log_probs etc.: lists of [len_i] tensors (current log-probs carry gradient)."""
    log_probs = torch.cat(log_probs)
    old_log_probs = torch.cat(old_log_probs)
    advantages = torch.cat(advantages)
    loss_mask = torch.cat(loss_masks).float()
    ratio = torch.exp(log_probs - old_log_probs)
    pg = -torch.min(ratio * advantages, ratio.clamp(1 - args.eps_clip, 1 + args.eps_clip_high) * advantages)
    n_samples = len(loss_masks)
    loss = (pg * loss_mask).sum() / n_samples
    clipfrac = ((ratio - 1).abs() > args.eps_clip).float().mean()
    return loss, {"pg_loss": loss.detach(), "pg_clipfrac": clipfrac.detach()}


def train_step(args, model, optimizer, rollout_data):
    rollout_data = get_selfplay_returns(args, rollout_data)
    log_probs = model.get_log_probs(rollout_data["tokens"], rollout_data["response_lengths"])
    loss, metrics = selfplay_policy_loss(
        args, log_probs, rollout_data["log_probs"], rollout_data["advantages"], rollout_data["loss_masks"]
    )
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return metrics
