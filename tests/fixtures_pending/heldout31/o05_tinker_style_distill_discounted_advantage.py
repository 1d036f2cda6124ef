# Reviewer note: on-policy distillation written as RL (Tinker-cookbook style)
# with kl_discount_factor = 1: the negative per-token log-ratio is turned into
# an undiscounted reward-to-go before it becomes the advantage, so each token
# is credited with its own and all later tokens' log-ratios: the
# score-function gradient of the sequence KL(student||teacher).
from dataclasses import dataclass
from typing import List

import torch


@dataclass
class DistillConfig:
    kl_penalty_coef: float = 1.0
    kl_discount_factor: float = 1.0
    loss_fn: str = "importance_sampling"


@dataclass
class Datum:
    tokens: torch.Tensor          # [T] prompt + completion
    sampling_logprobs: torch.Tensor  # [T] student log-probs recorded at sampling time
    mask: torch.Tensor            # [T] 1 on completion tokens


def discounted_future_sum(x: torch.Tensor, gamma: float) -> torch.Tensor:
    out = torch.zeros_like(x)
    running = x.new_zeros(())
    for t in range(x.shape[-1] - 1, -1, -1):
        running = x[t] + gamma * running
        out[t] = running
    return out


@torch.no_grad()
def incorporate_kl_penalty(data: List[Datum], teacher_logprobs: List[torch.Tensor], cfg: DistillConfig):
    advantages = []
    for d, tlp in zip(data, teacher_logprobs):
        # ok: KL003
        reverse_kl = (d.sampling_logprobs - tlp) * d.mask
        adv = -cfg.kl_penalty_coef * reverse_kl
        if cfg.kl_discount_factor > 0:
            adv = discounted_future_sum(adv, cfg.kl_discount_factor)
        advantages.append(adv * d.mask)
    return advantages


def importance_sampling_loss(target_logprobs, sampling_logprobs, advantages, mask):
    ratio = torch.exp(target_logprobs - sampling_logprobs)
    return -(ratio * advantages * mask).sum()


def train_step(student, teacher, optimizer, data: List[Datum], cfg: DistillConfig):
    with torch.no_grad():
        teacher_logprobs = [teacher.compute_logprobs(d.tokens) for d in data]
    advantages = incorporate_kl_penalty(data, teacher_logprobs, cfg)
    optimizer.zero_grad()
    total_tokens = sum(d.mask.sum() for d in data)
    for d, adv in zip(data, advantages):
        logits = student(d.tokens[None]).logits[0, :-1]
        target_logprobs = torch.log_softmax(logits.float(), -1).gather(-1, d.tokens[1:, None]).squeeze(-1)
        target_logprobs = torch.nn.functional.pad(target_logprobs, (1, 0))
        loss = importance_sampling_loss(target_logprobs, d.sampling_logprobs, adv, d.mask) / total_tokens
        loss.backward()
    optimizer.step()
    return {"teacher_kl": sum(((d.sampling_logprobs - t) * d.mask).sum() for d, t in zip(data, teacher_logprobs)).item() / len(data)}
