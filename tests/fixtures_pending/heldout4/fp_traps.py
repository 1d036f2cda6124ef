"""Code that looks like a KL bug and is not (or is a different one), from several trainers.

- a truncated importance weight built with ``torch.where`` times k3: on fresh samples the
  weight is 1 with gradient ``grad logp``, so each token's gradient is
  ``logr_t grad logp_t`` (right for one token), summed: KL003, not KL002 nor KL001;
- an exact top-k KL(teacher||student) between full next-token distributions on dataset
  sequences (offline distillation): no sampled estimator, quiet;
- the log-ratio of each whole response subtracted from its reward, then a group mean
  ``rewards.view(-1, n).mean(dim=1)`` subtracted as the baseline: the sample's own
  KL enters the baseline with weight 1/n, which only scales the gradient by (1 - 1/n);
  the penalty's sign is right: quiet (no KL006);
- a k3 helper defined here and called from a loss: one finding, at the call.

Fixture: parsed by the tests, never executed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def token_logps(model, input_ids, attention_mask, response_len: int):
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -response_len - 1 : -1].float()
    return torch.gather(logits.log_softmax(-1), 2, input_ids[:, -response_len:].unsqueeze(-1)).squeeze(-1)


def token_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    # ok: KL001, KL002, KL003
    return torch.exp(ref_logp - logp) - (ref_logp - logp) - 1


class TruncatedISKLTrainer:
    """Importance-weighted k3 with the weight truncated at ``is_cap`` (a GRPO variant)."""

    def __init__(self, model, optimizer, beta: float = 0.04, is_cap: float = 2.0):
        self.model = model
        self.optimizer = optimizer
        self.beta = beta
        self.is_cap = is_cap

    def compute_loss(self, batch):
        mask = batch["response_mask"]
        logp = token_logps(self.model, batch["input_ids"], batch["attention_mask"], mask.shape[1])
        old_logp = batch["old_logps"]
        ref_logp = batch["ref_logps"]
        ratio = torch.exp(logp - old_logp)
        pg = -ratio * batch["advantages"].unsqueeze(1)
        is_weight = torch.where(ratio > self.is_cap, torch.full_like(ratio, self.is_cap), ratio)
        # error: KL003
        # ok: KL001, KL002, KL004, KL005, KL006
        kl = is_weight * (torch.exp(ref_logp - logp) - (ref_logp - logp) - 1)
        return ((pg + self.beta * kl) * mask).sum() / mask.sum()


def topk_distillation_loss(student, teacher, batch, k: int = 64, temperature: float = 1.0):
    """Offline distillation on teacher-written sequences: KL(teacher||student) over the top-k."""
    labels_mask = batch["labels_mask"].float()
    student_logits = student(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits / temperature
    with torch.no_grad():
        teacher_logits = teacher(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits / temperature
        teacher_logp_topk, topk_idx = teacher_logits.log_softmax(-1).topk(k, dim=-1)
        teacher_logp_topk = teacher_logp_topk - torch.logsumexp(teacher_logp_topk, dim=-1, keepdim=True)
    student_logp_topk = F.log_softmax(student_logits, dim=-1).gather(-1, topk_idx)
    # ok: KL001, KL002, KL003, KL004, KL005, KL006
    per_position_kl = (teacher_logp_topk.exp() * (teacher_logp_topk - student_logp_topk)).sum(-1)
    return (per_position_kl * labels_mask).sum() / labels_mask.sum() * temperature**2


def grpo_sequence_kl_reward_step(model, ref_model, optimizer, batch, n: int = 8, beta: float = 0.05):
    mask = batch["response_mask"]
    logp = token_logps(model, batch["input_ids"], batch["attention_mask"], mask.shape[1])
    with torch.no_grad():
        ref_logp = token_logps(ref_model, batch["input_ids"], batch["attention_mask"], mask.shape[1])
        # ok: KL001, KL002, KL003, KL004, KL005, KL006
        seq_kl = ((logp - ref_logp) * mask).sum(-1)
        rewards = batch["scores"] - beta * seq_kl
        baseline = rewards.view(-1, n).mean(dim=1)
        advantages = rewards - baseline.repeat_interleave(n)
    loss = -(advantages * (logp * mask).sum(-1)).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def grpo_k3_helper_step(model, optimizer, batch, beta: float = 0.04):
    mask = batch["response_mask"]
    logp = token_logps(model, batch["input_ids"], batch["attention_mask"], mask.shape[1])
    pg_loss = -(batch["advantages"] * (logp * mask).sum(-1)).mean()
    # error: KL002
    kl = token_k3(logp, batch["ref_logps"])
    loss = pg_loss + beta * ((kl * mask).sum(-1) / mask.sum(-1)).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def train_distill(student, teacher, optimizer, loader):
    for batch in loader:
        loss = topk_distillation_loss(student, teacher, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
