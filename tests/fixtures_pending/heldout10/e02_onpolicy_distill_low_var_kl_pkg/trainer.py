"""Student update: the teacher's log-probs on the student's own samples play the
reference's role in the distillation loss."""
import torch

from .config import DistillConfig
from .core_algos import agg_loss, kl_penalty, logprobs_from_logits


class OnPolicyDistillTrainer:
    def __init__(self, cfg: DistillConfig, student, teacher, optimizer):
        self.cfg = cfg
        self.student = student
        self.teacher = teacher
        self.optimizer = optimizer

    @torch.no_grad()
    def teacher_logprobs(self, input_ids, responses):
        logits = self.teacher(input_ids).logits
        return logprobs_from_logits(logits, responses, self.cfg.temperature)

    def distill_loss(self, student_log_prob, teacher_log_prob, response_mask):
        # error: KL002
        per_token_kl = kl_penalty(student_log_prob, teacher_log_prob, kl_penalty=self.cfg.kl.kl_penalty)
        return agg_loss(per_token_kl, response_mask, self.cfg.loss_agg_mode)

    def update(self, input_ids, responses, response_mask):
        teacher_log_prob = self.teacher_logprobs(input_ids, responses)
        logits = self.student(input_ids).logits
        student_log_prob = logprobs_from_logits(logits, responses, self.cfg.temperature)
        loss = self.cfg.kl.kl_coef * self.distill_loss(student_log_prob, teacher_log_prob, response_mask)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {"distill/kl": loss.item()}
