"""REINFORCE-style trainer (TRL idioms) written as an objective to maximise.

The author writes the regularised objective ``A * log pi(y) - beta * KL`` and
minimises its negation; the KL is k2 of the sequence log-ratio, whose gradient
is that of KL(pi || pi_ref) of the response.
"""

from dataclasses import dataclass
from typing import Dict

import torch


@dataclass
class ReinforceConfig:
    kl_coef: float = 0.05
    rloo_k: int = 4
    temperature: float = 0.7
    max_grad_norm: float = 1.0


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    logps = torch.log_softmax(logits, dim=-1)
    return torch.gather(logps, dim=-1, index=index.unsqueeze(-1)).squeeze(-1)


class ReinforceTrainer:
    def __init__(self, policy, ref_policy, optimizer, accelerator, args: ReinforceConfig = ReinforceConfig()):
        self.policy = policy
        self.ref_policy = ref_policy
        self.optimizer = optimizer
        self.accelerator = accelerator
        self.args = args

    def _logprobs(self, model, query_responses: torch.Tensor, context_length: int) -> torch.Tensor:
        logits = model(query_responses).logits[:, context_length - 1 : -1] / (self.args.temperature + 1e-7)
        return selective_log_softmax(logits, query_responses[:, context_length:])

    def rloo_advantages(self, scores: torch.Tensor) -> torch.Tensor:
        scores = scores.reshape(self.args.rloo_k, -1)
        baseline = (scores.sum(0) - scores) / (self.args.rloo_k - 1)
        return (scores - baseline).flatten()

    def reinforce_loss(
        self,
        logprobs: torch.Tensor,
        ref_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
    ) -> torch.Tensor:
        seq_logprobs = (logprobs * response_mask).sum(1)
        seq_log_ratio = ((logprobs - ref_logprobs) * response_mask).sum(1)
        # error: KL006
        kl_penalty = 0.5 * seq_log_ratio.pow(2)
        objective = advantages * seq_logprobs + self.args.kl_coef * kl_penalty
        return -objective.mean()

    def training_step(self, batch: Dict[str, torch.Tensor]) -> Dict[str, float]:
        query_responses = batch["query_responses"]
        context_length = batch["context_length"]
        response_mask = batch["response_mask"]
        with torch.no_grad():
            ref_logprobs = self._logprobs(self.ref_policy, query_responses, context_length)
        advantages = self.rloo_advantages(batch["scores"])
        with self.accelerator.accumulate(self.policy):
            logprobs = self._logprobs(self.policy, query_responses, context_length)
            loss = self.reinforce_loss(logprobs, ref_logprobs, advantages, response_mask)
            self.accelerator.backward(loss)
            self.accelerator.clip_grad_norm_(self.policy.parameters(), self.args.max_grad_norm)
            self.optimizer.step()
            self.optimizer.zero_grad()
        return {"loss": loss.item()}
