"""Sequence-level GRPO trainer (GSPO-like), slime style.

Each response is one action: the policy-gradient term and the KL(pi || pi_ref)
penalty are both written on the response's summed log-probability. The
penalty keeps the low-variance estimate of the sequence KL as its value and
multiplies it by the sequence importance weight pi(y) / sg(pi(y)) (value 1),
which adds the score-function part that comes from y being sampled from pi:
the gradient is k3(R) grad log pi(y) + (1 - exp(-R)) grad log pi(y), whose
expectation is E[R grad log pi(y)] = grad KL(pi || pi_ref).
"""

from typing import Dict

import torch


class SequenceKL:
    """KL(pi || pi_ref) estimators on whole-response log-probabilities."""

    @staticmethod
    def k1(seq_logp: torch.Tensor, seq_ref_logp: torch.Tensor) -> torch.Tensor:
        return seq_logp - seq_ref_logp

    @staticmethod
    def low_var_is(seq_logp: torch.Tensor, seq_ref_logp: torch.Tensor) -> torch.Tensor:
        log_ratio = seq_ref_logp - seq_logp
        is_weight = torch.exp(seq_logp - seq_logp.detach())
        # ok: KL002
        return is_weight * (torch.expm1(log_ratio) - log_ratio)


class SequenceGRPOTrainer:
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, kl_coef: float = 0.02, temperature: float = 1.0):
        self.model = model
        self.optimizer = optimizer
        self.kl_coef = kl_coef
        self.temperature = temperature

    def _sequence_logprob(self, logits: torch.Tensor, response_ids: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
        token_logp = torch.log_softmax(logits / self.temperature, dim=-1).gather(-1, response_ids.unsqueeze(-1)).squeeze(-1)
        return (token_logp * response_mask).sum(dim=-1)

    def loss(self, logits: torch.Tensor, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        pg_loss = -(batch["advantages"] * self._sequence_logprob(logits, batch["response_ids"], batch["response_mask"])).mean()
        # ok: KL002, KL003
        kl = SequenceKL.low_var_is(self._sequence_logprob(logits, batch["response_ids"], batch["response_mask"]), batch["ref_seq_logprob"])
        return pg_loss + self.kl_coef * kl.mean()

    def train_step(self, batch: Dict[str, torch.Tensor]) -> float:
        response_length = batch["response_ids"].size(1)
        logits = self.model(batch["tokens"]).logits[:, -response_length - 1 : -1]
        loss = self.loss(logits, batch)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.item()
