"""Actor-rollout worker (ROLL/AReaL-style): the KL reward is computed during
rollout, kept on the worker, turned into returns, then used by the learner."""

import torch


def token_logps(logits, tokens):
    return torch.log_softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


class RolloutWorker:
    def __init__(self, kl_coef: float = 0.05, gamma: float = 1.0):
        self.kl_coef = kl_coef
        self.gamma = gamma
        self.kl = None
        self.rewards = None
        self.returns = None

    @torch.no_grad()
    def make_experience(self, logits, ref_logits, tokens, scores, mask):
        logps = token_logps(logits, tokens)
        ref_logps = token_logps(ref_logits, tokens)
        log_ratio = logps - ref_logps
        # error: KL004
        self.kl = (torch.exp(-log_ratio) - 1 + log_ratio) * mask
        rewards = -self.kl_coef * self.kl
        last = mask.sum(-1).long() - 1
        rewards[torch.arange(rewards.shape[0]), last] += scores
        self.rewards = rewards
        self.mask = mask

    @torch.no_grad()
    def compute_returns(self):
        returns = torch.zeros_like(self.rewards)
        running = torch.zeros_like(self.rewards[:, 0])
        for t in reversed(range(self.rewards.shape[1])):
            running = self.rewards[:, t] + self.gamma * running
            returns[:, t] = running
        self.returns = returns * self.mask
        return self.returns


class Learner:
    def policy_loss(self, logits, tokens, returns, mask):
        logps = token_logps(logits, tokens)
        return -(returns * logps * mask).sum(-1).mean()
