"""Estimators and advantage computation shared by the PPO workers."""
import torch


def kl_penalty(logprob: torch.FloatTensor, ref_logprob: torch.FloatTensor, kl_penalty: str = "kl") -> torch.FloatTensor:
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        kl = ref_logprob - logprob
        kl = torch.clamp(kl, min=-20, max=20)
        ratio = torch.exp(kl)
        # ok: KL004
        kld = (ratio - kl - 1).contiguous()
        return torch.clamp(kld, min=-10, max=10)
    raise NotImplementedError(kl_penalty)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1.0)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    return (x - mean) * torch.rsqrt(var + eps)


@torch.no_grad()
def compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma: float, lam: float):
    lastgaelam = 0
    advantages_reversed = []
    gen_len = token_level_rewards.shape[-1]
    for t in reversed(range(gen_len)):
        nextvalues = values[:, t + 1] if t < gen_len - 1 else 0.0
        delta = token_level_rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam = delta + gamma * lam * lastgaelam
        advantages_reversed.append(lastgaelam)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)
    returns = advantages + values
    advantages = masked_whiten(advantages, response_mask)
    return advantages, returns


def compute_policy_loss(old_log_prob, log_prob, advantages, response_mask, cliprange: float, loss_agg_mode: str):
    ratio = torch.exp(log_prob - old_log_prob)
    pg_losses = torch.max(-advantages * ratio, -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange))
    if loss_agg_mode == "token-mean":
        return masked_mean(pg_losses, response_mask)
    if loss_agg_mode == "seq-mean-token-sum":
        return (pg_losses * response_mask).sum(-1).mean()
    raise ValueError(loss_agg_mode)
