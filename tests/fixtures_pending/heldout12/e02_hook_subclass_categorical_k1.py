"""REINFORCE trainer with regulariser hooks; the KL variant overrides ``kl_penalty``."""
import math
from typing import Dict

import torch
import torch.nn.functional as F
from torch.distributions import Categorical


class PolicyGradientTrainer:
    """Sequence-level REINFORCE with gradient accumulation over micro-batches.

    Subclasses add regularisers by overriding :meth:`kl_penalty`, which receives
    the policy and reference logits of the shifted positions.
    """

    def __init__(self, policy, ref_policy, optimizer, beta: float = 0.05, micro_batch_size: int = 4, max_grad_norm: float = 1.0):
        self.policy = policy
        self.ref_policy = ref_policy
        self.optimizer = optimizer
        self.beta = beta
        self.micro_batch_size = micro_batch_size
        self.max_grad_norm = max_grad_norm

    def kl_penalty(self, logits: torch.Tensor, ref_logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor) -> Dict[str, torch.Tensor]:
        zero = logits.new_zeros(labels.shape)
        return {"kl": zero, "kl_mean": zero.sum()}

    def _logits(self, model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()

    def training_step(self, batch: Dict[str, torch.Tensor]) -> Dict[str, float]:
        input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
        labels = input_ids[:, 1:]
        mask = batch["response_mask"][:, 1:].float()
        rewards = batch["rewards"]
        n = input_ids.shape[0]
        num_micro = math.ceil(n / self.micro_batch_size)

        self.optimizer.zero_grad(set_to_none=True)
        logs = {"loss": 0.0, "kl": 0.0}
        for start in range(0, n, self.micro_batch_size):
            sl = slice(start, start + self.micro_batch_size)
            logits = self._logits(self.policy, input_ids[sl], attention_mask[sl])
            with torch.no_grad():
                ref_logits = self._logits(self.ref_policy, input_ids[sl], attention_mask[sl])

            logp = -F.cross_entropy(logits.transpose(1, 2), labels[sl], reduction="none")
            pg_loss = -(rewards[sl].unsqueeze(1) * logp * mask[sl]).sum(-1)
            kl_out = self.kl_penalty(logits, ref_logits, labels[sl], mask[sl])
            kl_loss = (kl_out["kl"] * mask[sl]).sum(-1)

            loss = (pg_loss + self.beta * kl_loss).mean() / num_micro
            loss.backward()
            logs["loss"] += loss.item()
            logs["kl"] += kl_out["kl_mean"].item() / num_micro

        if self.max_grad_norm is not None:
            params = [p for g in self.optimizer.param_groups for p in g["params"]]
            torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm)
        self.optimizer.step()
        return logs


class KLRegularisedTrainer(PolicyGradientTrainer):
    """Keeps the policy close to the SFT model with a per-token KL penalty."""

    def kl_penalty(self, logits, ref_logits, labels, mask):
        pi_lp = Categorical(logits=logits).log_prob(labels)
        sft_lp = Categorical(logits=ref_logits).log_prob(labels)
        # error: KL001
        kl = pi_lp - sft_lp
        kl_mean = (kl * mask).sum() / mask.sum().clamp(min=1.0)
        return {"kl": kl, "kl_mean": kl_mean.detach()}
