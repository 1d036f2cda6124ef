"""Per-token KL terms to the starting checkpoint."""

import torch


def turn_kl(logprobs: torch.Tensor, old_ckpt_logprobs: torch.Tensor, clamp: float = 10.0) -> torch.Tensor:
    r = (old_ckpt_logprobs - logprobs).clamp(-clamp, clamp)
    return r.exp() - r - 1.0
