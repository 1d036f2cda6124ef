"""KL(pi || pi_ref) penalty on the response tokens, as an ``nn.Module`` that
the trainer holds beside its policy loss. It reads the actor's logits, so the
temperature used for sampling is applied in one place."""

import torch
from torch import nn

from .reduce import masked_mean


class TokenKLPenalty(nn.Module):
    def __init__(self, temperature: float = 1.0):
        super().__init__()
        self.temperature = temperature

    def token_log_probs(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = logits / self.temperature
        picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        return picked - torch.logsumexp(logits, dim=-1)

    def forward(
        self,
        logits: torch.Tensor,
        labels: torch.Tensor,
        ref_log_probs: torch.Tensor,
        action_mask: torch.Tensor,
    ) -> torch.Tensor:
        log_probs = self.token_log_probs(logits, labels)
        # error: KL001
        kl = log_probs - ref_log_probs
        return masked_mean(kl, action_mask, dim=-1).mean()
