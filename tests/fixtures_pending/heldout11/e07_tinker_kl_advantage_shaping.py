"""tinker-cookbook-style KL shaping of per-token advantages, then an importance-sampling loss."""

from dataclasses import dataclass

import torch


@dataclass
class KLShapingConfig:
    kl_penalty_coef: float = 0.02
    kl_discount_factor: float = 1.0


def discounted_future_sum(x: torch.Tensor, gamma: float) -> torch.Tensor:
    """out[t] = sum_{s >= t} gamma^(s - t) x[s] for a 1-D tensor."""
    out = torch.zeros_like(x)
    running = torch.zeros((), dtype=x.dtype)
    for t in range(x.shape[0] - 1, -1, -1):
        running = x[t] + gamma * running
        out[t] = running
    return out


@torch.no_grad()
def incorporate_kl_penalty(data_D, base_logprobs_D, cfg: KLShapingConfig):
    """Shape every datum's advantages with the log-ratio of the sampler to the base model."""
    for datum, base_lp in zip(data_D, base_logprobs_D):
        mask = datum["mask"]
        logp_diff = (datum["logprobs"] - base_lp) * mask
        kl_to_go = discounted_future_sum(logp_diff, cfg.kl_discount_factor)
        # error: KL006
        datum["advantages"] = datum["advantages"] + cfg.kl_penalty_coef * kl_to_go * mask
    return data_D


def importance_sampling_loss(target_logprobs, sampling_logprobs, advantages, mask):
    prob_ratio = torch.exp(target_logprobs - sampling_logprobs)
    return -(prob_ratio * advantages * mask).sum()


def train_step(policy, optimizer, data_D, base_logprobs_D, cfg: KLShapingConfig = KLShapingConfig()):
    data_D = incorporate_kl_penalty(data_D, base_logprobs_D, cfg)
    optimizer.zero_grad()
    total = torch.zeros(())
    n_tokens = sum(float(d["mask"].sum()) for d in data_D)
    for datum in data_D:
        target_lp = policy.compute_logprobs(datum["tokens"])
        total = total + importance_sampling_loss(target_lp, datum["logprobs"], datum["advantages"], datum["mask"])
    loss = total / max(n_tokens, 1.0)
    loss.backward()
    optimizer.step()
    return {"loss": loss.item()}
