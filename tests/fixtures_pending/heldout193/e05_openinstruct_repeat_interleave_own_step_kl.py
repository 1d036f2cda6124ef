# Reviewer: open-instruct-style process-supervised GRPO. Each reasoning step is judged
# on its own: the advantage of a step is its PRM score minus the KL of that step
# (per-token log-ratio, detached, summed per step with scatter_add), and it is broadcast
# to the step's tokens with torch.repeat_interleave over the step lengths. There is no
# return over steps, so the KL of step k is credited to the tokens of step k only and
# never to the tokens of earlier steps that steered the policy into it: the KL part of
# the gradient keeps only sum_{s in step(t), s >= t} x_s of the reward-to-go, a partial
# gradient of the sequence KL(pi||pi_ref).
# Verdict: bug, KL003, reported where the KL reward is computed (the step_rewards line,
# which also computes the per-step log-ratio).
from dataclasses import dataclass

import torch

from open_instruct.model_utils import disable_dropout_in_model
from open_instruct.rl_utils import masked_mean


@dataclass
class Args:
    beta: float = 0.05
    clip_lower: float = 0.2
    clip_higher: float = 0.28
    step_token_id: int = 271
    max_steps: int = 32
    response_length: int = 2048


@torch.no_grad()
def compute_step_advantages(args: Args, logprobs, ref_logprobs, responses, response_mask, step_scores):
    ends = (responses == args.step_token_id).long() * response_mask.long()
    step_idx = (ends.cumsum(-1) - ends).clamp(max=args.max_steps - 1)
    step_lens = torch.zeros_like(step_scores).scatter_add(1, step_idx, response_mask)
    # error: KL003
    step_rewards = step_scores - args.beta * torch.zeros_like(step_scores).scatter_add(1, step_idx, (logprobs - ref_logprobs) * response_mask)
    has_tokens = step_lens > 0
    flat = torch.repeat_interleave(step_rewards[has_tokens], step_lens[has_tokens].long())
    advantages = torch.zeros_like(response_mask)
    advantages[response_mask.bool()] = flat
    return advantages


def grpo_loss(args: Args, new_logprobs, old_logprobs, advantages, response_mask):
    ratio = torch.exp(new_logprobs - old_logprobs)
    pg_losses = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1.0 - args.clip_lower, 1.0 + args.clip_higher)
    pg_loss_max = torch.max(pg_losses, pg_losses2)
    return (pg_loss_max * response_mask).sum() / (response_mask.shape[0] * args.response_length)


def train_step(args: Args, policy, optimizer, batch):
    advantages = compute_step_advantages(
        args, batch["logprobs"], batch["ref_logprobs"], batch["responses"], batch["response_mask"], batch["step_scores"]
    )
    new_logprobs = policy(batch["query_responses"], batch["responses"])
    loss = grpo_loss(args, new_logprobs, batch["logprobs"], advantages, batch["response_mask"])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return {"loss": loss.item(), "adv_mean": masked_mean(advantages, batch["response_mask"]).item()}
