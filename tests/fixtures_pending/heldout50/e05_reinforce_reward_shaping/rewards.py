# Reviewer: per-token reward shaping: the sequence score on the last response
# token plus a KL term on every token. The KL term has the wrong sign
# (+kl_coef * kl joins the rewards): BUG (KL006) on the estimate line.
import torch


@torch.no_grad()
def shape_rewards(
    scores: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    kl_coef: float,
    score_clip: float = None,
) -> torch.Tensor:
    """Token-level rewards for a batch of responses.

    scores:        [B]    sequence-level reward-model scores
    logprobs:      [B, T] rollout log-probs of the sampled tokens
    ref_logprobs:  [B, T] reference log-probs of the same tokens
    response_mask: [B, T] 1 on response tokens, 0 on padding
    """
    if score_clip is not None:
        scores = scores.clamp(-score_clip, score_clip)
    # error: KL006
    kl = (logprobs - ref_logprobs) * response_mask
    non_score_reward = kl_coef * kl
    rewards = non_score_reward.clone()
    last = response_mask.sum(dim=-1).long().clamp(min=1) - 1
    rewards[torch.arange(rewards.size(0), device=rewards.device), last] += scores
    return rewards * response_mask
