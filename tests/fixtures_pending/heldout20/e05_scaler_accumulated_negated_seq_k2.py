"""PPO actor update with gradient scaling, in the style of AReaL's actor.

The loss of each micro-batch is accumulated into one scalar; the regulariser
is k2 of the response's summed log-ratio to the reference (the sequence
KL(pi || pi_ref) penalty). ``train_step`` scales and backpropagates it.
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


def ppo_actor_loss(model, micro_batches: List[Dict[str, torch.Tensor]], cfg: PPOActorConfig) -> torch.Tensor:
    total_loss = 0.0
    for mb in micro_batches:
        resp_len = mb["loss_mask"].size(1)
        logits = model(mb["input_ids"]).logits[:, -resp_len - 1 : -1]
        logprobs = gather_logprobs(logits, mb["input_ids"][:, -resp_len:], cfg.temperature)
        ratio = torch.exp(logprobs - mb["old_logprobs"])
        adv = mb["advantages"]
        pg = -torch.min(ratio * adv, torch.clamp(ratio, 1.0 - cfg.eps_clip, 1.0 + cfg.eps_clip) * adv)
        pg_loss = masked_sum(pg, mb["loss_mask"]).mean()
        # error: KL006
        total_loss += (pg_loss - cfg.kl_ctl * 0.5 * masked_sum(logprobs - mb["ref_logprobs"], mb["loss_mask"]).pow(2).mean()) / len(micro_batches)
    return total_loss


def train_step(model, optimizer, scaler, micro_batches: List[Dict[str, torch.Tensor]], cfg: PPOActorConfig) -> float:
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=torch.cuda.is_available()):
        loss = ppo_actor_loss(model, micro_batches, cfg)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
    scaler.step(optimizer)
    scaler.update()
    return float(loss.detach())
