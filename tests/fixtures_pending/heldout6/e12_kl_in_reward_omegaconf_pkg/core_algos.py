"""verl-style algorithm helpers: KL penalty estimators, GAE and the policy-gradient loss."""
import torch


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty == "abs":
        return (logprob - ref_logprob).abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        kl = torch.clamp(ref_logprob - logprob, min=-20, max=20)
        return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)
    raise NotImplementedError(kl_penalty)


def compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma=1.0, lam=1.0):
    with torch.no_grad():
        lastgaelam = 0
        advantages_reversed = []
        gen_len = token_level_rewards.shape[-1]
        values = values * response_mask
        for t in reversed(range(gen_len)):
            nextvalues = values[:, t + 1] if t < gen_len - 1 else 0.0
            delta = token_level_rewards[:, t] + gamma * nextvalues - values[:, t]
            lastgaelam = delta + gamma * lam * lastgaelam
            advantages_reversed.append(lastgaelam)
        advantages = torch.stack(advantages_reversed[::-1], dim=1)
        returns = advantages + values
    return advantages * response_mask, returns


def compute_policy_loss(log_prob, old_log_prob, advantages, response_mask, cliprange=0.2):
    ratio = torch.exp(log_prob - old_log_prob)
    pg_losses = torch.max(-advantages * ratio, -advantages * torch.clamp(ratio, 1 - cliprange, 1 + cliprange))
    return (pg_losses * response_mask).sum() / response_mask.sum()
