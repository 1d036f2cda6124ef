"""PPO rollout scoring with a KL reward; estimator chosen by a dataclass config."""
from dataclasses import dataclass

import torch


@dataclass
class PPOConfig:
    kl_coef: float = 0.05
    kl_estimator: str = "k3"
    gamma: float = 1.0
    lam: float = 1.0
    cliprange: float = 0.2


def approx_kl(logprobs, ref_logprobs, estimator="k1"):
    log_ratio = logprobs.float() - ref_logprobs.float()
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return log_ratio**2 / 2.0
    if estimator == "k3":
        log_ratio = -log_ratio
        return log_ratio.exp() - 1 - log_ratio
    raise ValueError(estimator)


def gather_logprobs(logits, tokens):
    return logits.log_softmax(-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


class PPOTrainer:
    def __init__(self, policy, ref_policy, optimizer, config: PPOConfig):
        self.policy = policy
        self.ref_policy = ref_policy
        self.optimizer = optimizer
        self.config = config

    @torch.no_grad()
    def score_rollouts(self, query_response, responses, mask, scores):
        n = responses.size(1)
        logprobs = gather_logprobs(self.policy(query_response).logits[:, -n - 1 : -1], responses)
        ref_logprobs = gather_logprobs(self.ref_policy(query_response).logits[:, -n - 1 : -1], responses)
        # error: KL004
        kl = approx_kl(logprobs, ref_logprobs, estimator=self.config.kl_estimator)
        rewards = -self.config.kl_coef * kl * mask
        last = mask.sum(-1).long() - 1
        rewards[torch.arange(rewards.size(0)), last] += scores
        returns = torch.zeros_like(rewards)
        running = torch.zeros_like(scores)
        for t in reversed(range(n)):
            running = rewards[:, t] + self.config.gamma * running
            returns[:, t] = running
        return logprobs, returns

    def update(self, query_response, responses, mask, scores):
        old_logprobs, returns = self.score_rollouts(query_response, responses, mask, scores)
        n = responses.size(1)
        new_logprobs = gather_logprobs(self.policy(query_response).logits[:, -n - 1 : -1], responses)
        ratio = torch.exp(new_logprobs - old_logprobs)
        pg1 = -returns * ratio
        pg2 = -returns * ratio.clamp(1 - self.config.cliprange, 1 + self.config.cliprange)
        loss = (torch.max(pg1, pg2) * mask).sum() / mask.sum()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
