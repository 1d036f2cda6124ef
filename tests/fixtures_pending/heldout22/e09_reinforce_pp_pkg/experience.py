import torch


@torch.no_grad()
def compute_token_rewards(scores, log_probs, ref_log_probs, action_mask, kl_coef):
    """Per-token rewards: the sequence score on the last action token and a
    KL penalty on every action token."""
    # error: KL006
    kl = (log_probs - ref_log_probs) * action_mask
    kl_penalty = -kl_coef * kl
    rewards = torch.zeros_like(kl)
    last = action_mask.long().sum(-1) - 1
    rewards[torch.arange(rewards.size(0)), last] = scores.to(rewards.dtype)
    return rewards - kl_penalty, kl


@torch.no_grad()
def discounted_returns(rewards, action_mask, gamma=1.0):
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.size(1))):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
    return returns * action_mask


@torch.no_grad()
def whiten_advantages(returns, action_mask, eps=1e-8):
    valid = returns[action_mask.bool()]
    return (returns - valid.mean()) / (valid.std() + eps) * action_mask
