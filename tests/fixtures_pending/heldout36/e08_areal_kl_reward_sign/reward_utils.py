import torch


@torch.no_grad()
def shape_rewards(scores, logprobs, ref_logprobs, loss_mask, kl_ctl: float, max_reward_clip: float = 20.0):
    """Per-token rewards: a KL penalty on every generated token, the task score on the last one."""
    scores = scores.clamp(-max_reward_clip, max_reward_clip)
    # error: KL006
    kl = ref_logprobs - logprobs
    rewards = -kl_ctl * kl * loss_mask
    seq_len = loss_mask.sum(-1).long()
    batch_idx = torch.arange(rewards.size(0), device=rewards.device)
    rewards[batch_idx, (seq_len - 1).clamp(min=0)] += scores
    return rewards
