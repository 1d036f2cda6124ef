"""GRPO learner in the style of open-instruct's ``grpo_fast``.

Loss per completion: the clipped surrogate on group-normalised advantages plus
``beta`` times KL(pi(.|x) || pi_ref(.|x)) of the sampled completion, estimated
with k2. The batch is cut into micro-batches; padding is excluded with
``torch.where`` so that NaNs in padded logits never reach the sum.
"""

from dataclasses import dataclass
from typing import Dict, List

import torch


@dataclass
class GRPOConfig:
    beta: float = 0.05
    clip_lower: float = 0.2
    clip_higher: float = 0.272
    num_mini_batches: int = 2
    temperature: float = 1.0


class GRPOLearner:
    def __init__(self, policy: torch.nn.Module, optimizer: torch.optim.Optimizer, config: GRPOConfig):
        self.policy = policy
        self.optimizer = optimizer
        self.config = config

    def _micro_batches(self, batch: Dict[str, torch.Tensor]) -> List[Dict[str, torch.Tensor]]:
        n = min(self.config.num_mini_batches, batch["query_responses"].size(0))
        chunks = {key: value.chunk(n) for key, value in batch.items()}
        return [{key: chunks[key][i] for key in batch} for i in range(n)]

    def _micro_batch_loss(self, mb: Dict[str, torch.Tensor]) -> torch.Tensor:
        response_length = mb["responses"].size(1)
        logits = self.policy(mb["query_responses"]).logits[:, -response_length - 1 : -1]
        logits = logits / self.config.temperature
        new_logprobs = torch.log_softmax(logits, dim=-1).gather(-1, mb["responses"].unsqueeze(-1)).squeeze(-1)
        mask = mb["response_masks"].bool()

        ratio = torch.exp(new_logprobs - mb["old_logprobs"])
        adv = mb["advantages"].unsqueeze(-1)
        pg_losses = -adv * ratio
        pg_losses2 = -adv * torch.clamp(ratio, 1.0 - self.config.clip_lower, 1.0 + self.config.clip_higher)
        pg_loss = torch.max(pg_losses, pg_losses2)

        log_ratio = new_logprobs - mb["ref_logprobs"]
        # error: KL003
        kl = torch.where(mask, 0.5 * log_ratio.pow(2), torch.zeros_like(log_ratio))
        per_token = torch.where(mask, pg_loss, torch.zeros_like(pg_loss)) + self.config.beta * kl
        return per_token.sum(dim=1).mean()

    def compute_loss(self, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        micro_batches = self._micro_batches(batch)
        losses = [self._micro_batch_loss(mb) for mb in micro_batches]
        return torch.stack(losses).mean()

    def step(self, batch: Dict[str, torch.Tensor]) -> float:
        self.optimizer.zero_grad()
        loss = self.compute_loss(batch)
        loss.backward()
        self.optimizer.step()
        return loss.item()
