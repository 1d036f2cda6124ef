"""REINFORCE written as an objective to maximise then negated; the sequence-k2 penalty enters the objective with +."""
from dataclasses import dataclass

import torch


@dataclass
class ReinforceConfig:
    kl_coef: float = 0.02
    baseline: str = "batch_mean"
    max_grad_norm: float = 1.0


class ReinforceLearner:
    def __init__(self, policy, ref_policy, optimizer, cfg: ReinforceConfig = ReinforceConfig()):
        self.policy = policy
        self.ref_policy = ref_policy
        self.optimizer = optimizer
        self.cfg = cfg

    def seq_logprobs(self, model, tokens, mask):
        logits = model(tokens).logits[:, :-1]
        logp = logits.log_softmax(-1).gather(-1, tokens[:, 1:, None]).squeeze(-1)
        return logp * mask[:, 1:]

    def objective(self, tokens, mask, rewards):
        logp = self.seq_logprobs(self.policy, tokens, mask)
        with torch.no_grad():
            ref_logp = self.seq_logprobs(self.ref_policy, tokens, mask)
        seq_logp = logp.sum(-1)
        seq_log_ratio = (logp - ref_logp).sum(-1)
        kl = 0.5 * seq_log_ratio.pow(2).mean()
        adv = rewards - rewards.mean()
        # error: KL006
        objective = (adv * seq_logp).mean() + self.cfg.kl_coef * kl
        return objective, kl.detach()

    def update(self, tokens, mask, rewards):
        objective, kl = self.objective(tokens, mask, rewards)
        loss = -objective
        self.optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.cfg.max_grad_norm)
        self.optimizer.step()
        return {"objective": objective.item(), "kl": kl.item()}
