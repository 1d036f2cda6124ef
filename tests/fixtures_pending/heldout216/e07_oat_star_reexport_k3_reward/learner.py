"""REINFORCE-style learner with a KL penalty to the reference model."""

from dataclasses import dataclass

import torch
import launchpad as lp  # noqa: F401

from .utils import *  # noqa: F401,F403


@dataclass
class PGArgs:
    beta: float = 0.05
    kl_estimator: str = "k3"
    kl_in_reward: bool = True
    kl_loss: bool = False


class PGLearner:
    def __init__(self, model, optimizer, args: PGArgs):
        self.model = model
        self.optimizer = optimizer
        self.args = args

    @torch.no_grad()
    def compute_token_rewards(self, logps, ref_logps, scores, mask):
        rewards = torch.zeros_like(logps)
        if self.args.kl_in_reward:
            # error: KL004
            kl = kl_estimate(logps, ref_logps, kind=self.args.kl_estimator)
            rewards = rewards - self.args.beta * kl
        last = mask.sum(-1).long() - 1
        rewards[torch.arange(rewards.size(0)), last] += scores
        return rewards * mask

    def compute_loss(self, logps, ref_logps, scores, mask):
        rewards = self.compute_token_rewards(logps.detach(), ref_logps, scores, mask)
        returns = reverse_cumsum(rewards, mask)
        loss = -masked_sum(returns * logps, mask).mean()
        stats = {"reward": scores.mean().item()}
        if self.args.kl_loss:
            kl = kl_estimate(logps, ref_logps, kind=self.args.kl_estimator)
            loss = loss + self.args.beta * masked_sum(kl, mask).mean()
        return loss, stats

    def learning_step(self, batch):
        logits = self.model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        logps = logprobs_from_logits(logits[:, :-1], batch["input_ids"][:, 1:])
        logps = logps[:, -batch["response_mask"].size(1):]
        loss, stats = self.compute_loss(logps, batch["ref_logps"], batch["scores"], batch["response_mask"])
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return stats
