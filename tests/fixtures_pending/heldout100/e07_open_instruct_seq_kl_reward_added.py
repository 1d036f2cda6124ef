# Reviewer: open-instruct-style online RL step with a sequence-level KL in the
# reward and an RLOO baseline in the group layout. Under no_grad the sequence
# log-ratio is an einsum over time of the [B, G, T] log-probs (right axis),
# and it is ADDED to the verifiable reward: rewards = scores + kl_coef * KL.
# The advantage (leave-one-out over the G samples) weights sum_t logp_t in a
# minimised loss, so the KL part of the gradient is -kl_coef *
# grad KL(pi||pi_ref): gradient descent pushes the policy away from the
# reference. The estimator is k1, the right one for a reward; the sign is not.
# Verdict: bug, KL006, reported on the line that computes the estimate (and,
# on the same line, the reward).
import torch
from open_instruct.model_utils import get_reward  # noqa: F401


@torch.no_grad()
def group_rloo_advantages(logprobs, ref_logprobs, scores, response_mask, num_samples_per_prompt, kl_coef):
    G = num_samples_per_prompt
    T = logprobs.shape[-1]
    lp = logprobs.view(-1, G, T)
    ref = ref_logprobs.view(-1, G, T)
    mask = response_mask.view(-1, G, T).to(lp.dtype)
    scores = scores.view(-1, G)

    # error: KL006
    rewards = scores + kl_coef * torch.einsum("bgt,bgt->bg", lp - ref, mask)
    baseline = (rewards.sum(dim=1, keepdim=True) - rewards) / (G - 1)
    advantages = rewards - baseline
    return advantages.view(-1), rewards.view(-1)


def train_step(policy, batch, args, optimizer):
    new_logprobs = policy.forward_logprobs(batch["query_responses"], batch["pad_token_id"])
    advantages, rewards = group_rloo_advantages(
        new_logprobs.detach(), batch["ref_logprobs"], batch["scores"], batch["response_mask"],
        args.num_samples_per_prompt_rollout, args.beta,
    )
    mask = batch["response_mask"].to(new_logprobs.dtype)
    ratio = torch.exp(new_logprobs - batch["old_logprobs"])
    pg_losses = -advantages[:, None] * ratio
    pg_losses2 = -advantages[:, None] * torch.clamp(ratio, 1.0 - args.clip_lower, 1.0 + args.clip_higher)
    loss = (torch.max(pg_losses, pg_losses2) * mask).sum(dim=-1).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return {"loss": loss.item(), "rewards": rewards.mean().item()}
