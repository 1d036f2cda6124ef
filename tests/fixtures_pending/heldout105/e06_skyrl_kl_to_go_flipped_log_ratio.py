# Reviewer: SkyRL-style policy loss written by a coding assistant. It
# implements the "correct" sequence KL gradient (score function with a
# reward-to-go of the detached log-ratio, reverse cumsum over time), but the
# helper `_log_ratio` returns log(pi_ref / pi) (its docstring says
# log(pi / pi_ref)), and the term is added to a minimised loss.
# Verdict: BUG (KL006). The expected gradient of the KL term is exactly
# -grad KL(pi||pi_ref): gradient descent pushes the policy away from the
# reference. Reported on the line that multiplies the detached weight by the
# log-probs (the score-function KL term).
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch

from skyrl_train.utils.ppo_utils import PolicyLossRegistry


@dataclass
class KLToGoConfig:
    kl_loss_coef: float = 0.02
    eps_clip_low: float = 0.2
    eps_clip_high: float = 0.2
    use_kl_loss: bool = True
    normalize_kl_by_tokens: bool = False


def _log_ratio(log_probs: torch.Tensor, base_log_probs: torch.Tensor) -> torch.Tensor:
    """log(pi / pi_ref) per token, detached (it is used as a weight)."""
    if base_log_probs is None:
        raise ValueError("base_log_probs is required for the KL term")
    return (base_log_probs - log_probs).detach()


def _reverse_cumsum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """G_t = sum_{s >= t} x_s over the valid tokens of each row."""
    x = x * mask
    return torch.flip(torch.cumsum(torch.flip(x, dims=[-1]), dim=-1), dims=[-1])


@PolicyLossRegistry.register("ppo_kl_to_go")
def ppo_kl_to_go_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    base_log_probs: Optional[torch.Tensor],
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    config: Optional[KLToGoConfig] = None,
) -> Tuple[torch.Tensor, Dict[str, float]]:
    config = config or KLToGoConfig()
    loss_mask = loss_mask.to(log_probs.dtype)
    ratio = (log_probs - old_log_probs).exp()
    surr1 = ratio * advantages
    surr2 = ratio.clamp(1 - config.eps_clip_low, 1 + config.eps_clip_high) * advantages
    pg_loss = -(torch.min(surr1, surr2) * loss_mask).sum(-1).mean()
    stats = {"pg_loss": pg_loss.item()}

    if not config.use_kl_loss or base_log_probs is None:
        return pg_loss, stats

    kl_to_go = _reverse_cumsum(_log_ratio(log_probs, base_log_probs), loss_mask)
    # error: KL006
    kl_term = (kl_to_go * log_probs * loss_mask).sum(-1)
    if config.normalize_kl_by_tokens:
        kl_term = kl_term / loss_mask.sum(-1).clamp_min(1)
    kl_loss = kl_term.mean()
    loss = pg_loss + config.kl_loss_coef * kl_loss
    stats["kl_loss"] = kl_loss.item()
    stats["kl_to_go_first"] = (kl_to_go[:, 0]).mean().item()
    return loss, stats
