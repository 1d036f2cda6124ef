"""PPO actor update with gradient scaling, in the style of AReaL's actor.

The objective of each micro-batch (the clipped surrogate, minus the KL
penalty) is accumulated into one scalar that is maximised: ``train_step``
scales and backpropagates its negation. The regulariser is k2 of the
response's summed log-ratio to the reference (the sequence KL(pi || pi_ref)).
"""

from dataclasses import dataclass
from typing import Dict, List

import torch


@dataclass
class PPOActorConfig:
    eps_clip: float = 0.2
    kl_ctl: float = 0.05
    temperature: float = 1.0
    max_grad_norm: float = 1.0


def gather_logprobs(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    log_probs = torch.log_softmax(logits / temperature, dim=-1)
    return torch.gather(log_probs, -1, labels.unsqueeze(-1)).squeeze(-1)


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return (x * mask).sum(dim=dim)


def ppo_actor_objective(model, micro_batches: List[Dict[str, torch.Tensor]], cfg: PPOActorConfig) -> torch.Tensor:
    objective = 0.0
    for mb in micro_batches:
        resp_len = mb["loss_mask"].size(1)
        logits = model(mb["input_ids"]).logits[:, -resp_len - 1 : -1]
        logprobs = gather_logprobs(logits, mb["input_ids"][:, -resp_len:], cfg.temperature)
        ratio = torch.exp(logprobs - mb["old_logprobs"])
        adv = mb["advantages"]
        surrogate = torch.min(ratio * adv, torch.clamp(ratio, 1.0 - cfg.eps_clip, 1.0 + cfg.eps_clip) * adv)
        pg_objective = masked_sum(surrogate, mb["loss_mask"]).mean()
        # ok: KL003, KL006
        objective += (pg_objective - cfg.kl_ctl * 0.5 * masked_sum(logprobs - mb["ref_logprobs"], mb["loss_mask"]).pow(2).mean()) / len(micro_batches)
    return objective


def train_step(model, optimizer, scaler, micro_batches: List[Dict[str, torch.Tensor]], cfg: PPOActorConfig) -> float:
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=torch.cuda.is_available()):
        objective = ppo_actor_objective(model, micro_batches, cfg)
    loss = -objective
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
    scaler.step(optimizer)
    scaler.update()
    return float(loss.detach())
