# Reviewer: SkyRL-style on-policy distillation. DistillationLoss is an abstract
# base class; DistillationLoss.create(name) is a @classmethod that walks
# cls.__subclasses__() for the configured name, default "reverse_kl". The
# student samples the responses; ReverseKL.__call__ returns the per-token
# student_logp - teacher_logp, which the trainer sums over tokens and
# minimises with its gradient. That is k1 of KL(student||teacher) on the
# student's own samples: zero expected gradient.
# Verdict: bug, KL001, on the line of the loss that calls the distillation term.
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from skyrl_train.training_batch import TrainingInputBatch


class DistillationLoss(ABC):
    name: str = ""

    @abstractmethod
    def __call__(self, student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor) -> torch.Tensor:
        """Per-token divergence term, shape [batch, response_len]."""

    @classmethod
    def create(cls, name: str) -> "DistillationLoss":
        for sub in cls.__subclasses__():
            if sub.name == name:
                return sub()
        raise ValueError(f"unknown distillation loss {name!r}")


class ReverseKL(DistillationLoss):
    name = "reverse_kl"

    def __call__(self, student_logprobs, teacher_logprobs):
        # ok: KL001
        return student_logprobs - teacher_logprobs


class ForwardKLOnTeacherSamples(DistillationLoss):
    name = "forward_kl_teacher_samples"

    def __call__(self, student_logprobs, teacher_logprobs):
        # ok: KL001
        return teacher_logprobs - student_logprobs


@dataclass
class DistillConfig:
    distill_loss: str = "reverse_kl"
    distill_coef: float = 1.0
    max_response_len: int = 1024


class OnPolicyDistillTrainer:
    def __init__(self, cfg: DistillConfig, student=None, teacher=None, optimizer=None):
        self.cfg = cfg
        self.student = student
        self.teacher = teacher
        self.optimizer = optimizer
        self.loss_term = DistillationLoss.create(cfg.distill_loss)

    def _logprobs(self, model, sequences, attention_mask, response_len):
        logits = model(sequences, attention_mask=attention_mask).logits[:, -response_len - 1 : -1]
        targets = sequences[:, -response_len:]
        return torch.gather(logits.log_softmax(-1), -1, targets.unsqueeze(-1)).squeeze(-1)

    def distill_loss(self, student_logprobs, teacher_logprobs, loss_mask):
        # error: KL001
        per_token = self.loss_term(student_logprobs, teacher_logprobs)
        loss = self.cfg.distill_coef * (per_token * loss_mask).sum(-1).mean()
        return loss, {"distill/reverse_kl": (per_token.detach() * loss_mask).sum(-1).mean().item()}

    def train_step(self, batch: TrainingInputBatch):
        sequences, attention_mask, loss_mask = batch["sequences"], batch["attention_mask"], batch["loss_mask"]
        response_len = loss_mask.size(1)
        student_logprobs = self._logprobs(self.student, sequences, attention_mask, response_len)
        with torch.no_grad():
            teacher_logprobs = self._logprobs(self.teacher, sequences, attention_mask, response_len)
        loss, metrics = self.distill_loss(student_logprobs, teacher_logprobs, loss_mask)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return metrics
