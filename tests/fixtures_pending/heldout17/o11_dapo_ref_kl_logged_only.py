"""DAPO-style policy loss (no KL term in the loss) that still *reports* the KL.

DAPO drops the KL penalty; the KL to the reference and the PPO approximate KL
to the behaviour policy are computed under ``torch.no_grad()`` for the logs
only.
"""

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch


@dataclass
class DAPOActorConfig:
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28
    loss_agg_mode: str = "token-mean"
    ppo_micro_batch_size: int = 8
    grad_clip: float = 1.0


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: Optional[int] = None) -> torch.Tensor:
    if axis is None:
        return (values * mask).sum() / mask.sum().clamp(min=1.0)
    return (values * mask).sum(axis) / mask.sum(axis).clamp(min=1.0)


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str) -> torch.Tensor:
    if loss_agg_mode == "token-mean":
        return masked_mean(loss_mat, loss_mask)
    if loss_agg_mode == "seq-mean-token-sum":
        return (loss_mat * loss_mask).sum(-1).mean()
    raise ValueError(loss_agg_mode)


def compute_dapo_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    ref_log_prob: Optional[torch.Tensor],
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    cfg: DAPOActorConfig,
) -> Tuple[torch.Tensor, Dict[str, float]]:
    negative_approx_kl = log_prob - old_log_prob
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - cfg.clip_ratio_low, 1 + cfg.clip_ratio_high)
    pg_loss = agg_loss(torch.maximum(pg_losses1, pg_losses2), response_mask, cfg.loss_agg_mode)

    metrics: Dict[str, float] = {}
    with torch.no_grad():
        metrics["actor/ppo_kl"] = masked_mean(-negative_approx_kl, response_mask).item()
        metrics["actor/pg_clipfrac"] = masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask).item()
        if ref_log_prob is not None:
            log_ratio = ref_log_prob - log_prob
            # ok: KL002, KL005
            ref_kl = torch.exp(log_ratio) - log_ratio - 1
            metrics["actor/ref_kl"] = masked_mean(ref_kl, response_mask).item()
            # ok: KL001, KL005
            metrics["actor/ref_kl_seq"] = (-log_ratio * response_mask).sum(-1).mean().item()
    return pg_loss, metrics


class DAPOActor:
    def __init__(self, actor_module, optimizer, cfg: DAPOActorConfig = DAPOActorConfig()):
        self.actor_module = actor_module
        self.optimizer = optimizer
        self.cfg = cfg

    def _log_prob(self, input_ids: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
        logits = self.actor_module(input_ids).logits[:, -responses.size(1) - 1 : -1]
        return torch.gather(torch.log_softmax(logits.float(), -1), -1, responses.unsqueeze(-1)).squeeze(-1)

    def update_policy(self, data: Dict[str, torch.Tensor]) -> Dict[str, float]:
        n = data["responses"].size(0)
        mbs = self.cfg.ppo_micro_batch_size
        self.optimizer.zero_grad()
        all_metrics: Dict[str, float] = {}
        for start in range(0, n, mbs):
            mb = {k: v[start : start + mbs] for k, v in data.items()}
            log_prob = self._log_prob(mb["input_ids"], mb["responses"])
            loss, metrics = compute_dapo_loss(
                log_prob, mb["old_log_probs"], mb.get("ref_log_prob"), mb["advantages"], mb["response_mask"], self.cfg
            )
            (loss * mb["responses"].size(0) / n).backward()
            all_metrics.update(metrics)
        torch.nn.utils.clip_grad_norm_(self.actor_module.parameters(), self.cfg.grad_clip)
        self.optimizer.step()
        return all_metrics
