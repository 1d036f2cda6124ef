# Part of e06 (see __init__.py). KL and reward helpers.
import torch


def compute_approx_kl(log_probs, log_probs_base, kl_estimator="k1"):
    log_ratio = log_probs - log_probs_base
    if kl_estimator == "k1":
        return log_ratio
    if kl_estimator == "k2":
        return 0.5 * log_ratio.square()
    if kl_estimator == "k3":
        neg = -log_ratio
        return torch.expm1(neg) - neg
    raise ValueError(f"unknown kl_estimator {kl_estimator}")


def compute_token_reward(scores, kl, kl_coef, response_mask):
    """Outcome score on the last response token, -kl_coef * kl on every token."""
    token_rewards = -kl_coef * kl * response_mask
    last = response_mask.sum(-1).long().clamp(min=1) - 1
    rows = torch.arange(token_rewards.size(0), device=token_rewards.device)
    token_rewards[rows, last] += scores
    return token_rewards


def get_cumulative_returns(rewards, response_mask, gamma=1.0):
    returns = torch.zeros_like(rewards)
    cumulative = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.size(1))):
        cumulative = rewards[:, t] + gamma * cumulative
        returns[:, t] = cumulative
    return returns * response_mask
