"""KL(pi || pi_ref) penalty on the response tokens, as an ``nn.Module`` that
the trainer holds beside its policy loss. It reads the actor's logits, so the
temperature used for sampling is applied in one place.

The value is the k1 estimate of each token (what the logs show); the gradient
is the sequence KL's: each token's log-prob weighted by the log-ratio of that
token and of every later one."""

import torch
from torch import nn

from .reduce import masked_sum, reverse_cumsum


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
        # ok: KL001
        kl = log_probs - ref_log_probs
        kl_to_go = reverse_cumsum((kl * action_mask).detach(), dim=-1)
        kl = kl.detach() + kl_to_go * (log_probs - log_probs.detach())
        return masked_sum(kl, action_mask, dim=-1).mean()
