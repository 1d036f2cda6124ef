from typing import Callable

import torch


def regularised_pg_loss(
    logps: torch.Tensor,
    ref_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    kl_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    beta: float,
    entropy: torch.Tensor = None,
    ent_coef: float = 0.0,
):
    """REINFORCE with a sequence-level advantage plus a KL regulariser (token-sum, seq-mean)."""
    pg = -(advantages.unsqueeze(-1) * logps * mask).sum(-1)
    # error: KL003
    kl = kl_fn(logps, ref_logps)
    kl_term = (kl * mask).sum(-1)
    loss = (pg + beta * kl_term).mean()
    if entropy is not None and ent_coef > 0:
        loss = loss - ent_coef * (entropy * mask).sum(-1).mean()
    return loss, {"kl": kl_term.mean().item()}
