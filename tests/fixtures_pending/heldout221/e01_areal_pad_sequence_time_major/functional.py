"""Log-prob gathering and the clipped PPO token loss for packed micro-batches."""
from typing import Dict, Tuple

import torch


def gather_logprobs(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Per-token log-probs of `labels` under `logits` ([total_tokens, vocab])."""
    log_probs = torch.log_softmax(logits.float() / temperature, dim=-1)
    return log_probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def ppo_actor_loss_fn(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    loss_mask: torch.Tensor,
) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """Clipped surrogate loss per token (not reduced); masked positions are 0."""
    ratio = torch.where(loss_mask, torch.exp(logprobs - old_logprobs), 0.0)
    clipped_ratio = torch.clamp(ratio, 1.0 - eps_clip, 1.0 + eps_clip)
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * clipped_ratio
    clip_mask = pg_loss1.detach() < pg_loss2.detach()
    token_loss = torch.where(loss_mask, torch.max(pg_loss1, pg_loss2), 0.0)
    stat = dict(
        clip_mask=clip_mask & loss_mask,
        importance_weight=ratio.detach(),
        approx_kl=(logprobs - old_logprobs).detach(),
    )
    return token_loss, stat
