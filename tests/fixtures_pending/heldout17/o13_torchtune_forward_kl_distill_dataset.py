"""torchtune-style knowledge distillation on a fixed SFT dataset.

The student is trained on dataset sequences (teacher-forced, not sampled from
the student) with cross-entropy plus the exact full-vocabulary
KL(teacher || student) at each position.  The teacher is frozen.
"""

from dataclasses import dataclass
from typing import Dict, Iterable

import torch
import torch.nn.functional as F


@dataclass
class KDRecipeConfig:
    kd_ratio: float = 0.5
    kd_temperature: float = 1.0
    ignore_index: int = -100
    gradient_accumulation_steps: int = 4


class ForwardKLDistillLoss(torch.nn.Module):
    """KL(teacher || student) per position, averaged over the non-ignored tokens."""

    def __init__(self, ignore_index: int = -100, temperature: float = 1.0):
        super().__init__()
        self.ignore_index = ignore_index
        self.temperature = temperature

    def forward(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        teacher_logprobs = torch.log_softmax(teacher_logits.float() / self.temperature, dim=-1)
        student_logprobs = torch.log_softmax(student_logits.float() / self.temperature, dim=-1)
        teacher_probs = teacher_logprobs.exp()
        # ok: KL002, KL003
        per_token_kl = (teacher_probs * (teacher_logprobs - student_logprobs)).sum(dim=-1)
        mask = (labels != self.ignore_index).float()
        return (per_token_kl * mask).sum() / mask.sum().clamp(min=1.0) * self.temperature**2


def kd_step(student_logits, teacher_logits, labels, kd_loss_fn: ForwardKLDistillLoss, cfg: KDRecipeConfig) -> torch.Tensor:
    ce_loss = F.cross_entropy(
        student_logits.reshape(-1, student_logits.size(-1)), labels.reshape(-1), ignore_index=cfg.ignore_index
    )
    kd_loss = kd_loss_fn(student_logits, teacher_logits, labels)
    return (1 - cfg.kd_ratio) * ce_loss + cfg.kd_ratio * kd_loss


def train_epoch(student, teacher, optimizer, dataloader: Iterable[Dict[str, torch.Tensor]], cfg: KDRecipeConfig) -> float:
    kd_loss_fn = ForwardKLDistillLoss(cfg.ignore_index, cfg.kd_temperature)
    teacher.eval()
    running = 0.0
    for idx, batch in enumerate(dataloader):
        tokens, labels = batch["tokens"], batch["labels"]
        student_logits = student(tokens)[:, :-1]
        with torch.no_grad():
            teacher_logits = teacher(tokens)[:, :-1]
        loss = kd_step(student_logits, teacher_logits, labels[:, 1:], kd_loss_fn, cfg)
        (loss / cfg.gradient_accumulation_steps).backward()
        running += loss.item()
        if (idx + 1) % cfg.gradient_accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return running
