"""Sequence-level GRPO trainer (GSPO-like), slime style.

Each response is one action: the policy-gradient term and the KL(pi || pi_ref)
penalty are both written on the response's summed log-probability, with the
low-variance estimator of the sequence KL.
"""

from typing import Dict

import torch


class SequenceKL:
    """KL(pi || pi_ref) estimators on whole-response log-probabilities."""

    @staticmethod
    def k1(seq_logp: torch.Tensor, seq_ref_logp: torch.Tensor) -> torch.Tensor:
        return seq_logp - seq_ref_logp

    @staticmethod
    def low_var(seq_logp: torch.Tensor, seq_ref_logp: torch.Tensor) -> torch.Tensor:
        log_ratio = seq_ref_logp - seq_logp
        return torch.expm1(log_ratio) - log_ratio


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
        # error: KL002
        kl = SequenceKL.low_var(self._sequence_logprob(logits, batch["response_ids"], batch["response_mask"]), batch["ref_seq_logprob"])
        return pg_loss + self.kl_coef * kl.mean()

    def train_step(self, batch: Dict[str, torch.Tensor]) -> float:
        response_length = batch["response_ids"].size(1)
        logits = self.model(batch["tokens"]).logits[:, -response_length - 1 : -1]
        loss = self.loss(logits, batch)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.item()
