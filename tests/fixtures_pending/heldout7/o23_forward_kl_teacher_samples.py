"""Sequence-level knowledge distillation (Kim & Rush style): the *teacher* generates the responses
and the student is trained on them with the forward KL(pi_teacher||pi_student).

What it shows (correct): the loss is sum_t (teacher_lp - student_lp)(y_t) over teacher samples.
It looks like a differentiated k1 estimate, but the samples come from the teacher, not from the
student: the sampling distribution does not depend on the student's parameters, so
E_{y~pi_T}[grad sum_t (log pi_T - log pi)(y_t)] = -E_{y~pi_T}[grad log pi(y)] = grad KL(pi_T||pi)
of the sequence exactly, the divergence this trainer means to minimise (mass-covering).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SeqKDConfig:
    max_new_tokens: int = 512
    teacher_temperature: float = 1.0
    pad_token_id: int = 0


def token_logps(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)


class SeqKDTrainer:
    def __init__(self, student, teacher, optimizer, cfg: SeqKDConfig):
        self.student = student
        self.teacher = teacher.eval().requires_grad_(False)
        self.optimizer = optimizer
        self.cfg = cfg

    @torch.no_grad()
    def teacher_batch(self, prompt_ids, prompt_mask) -> dict[str, torch.Tensor]:
        seqs = self.teacher.generate(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            do_sample=True,
            temperature=self.cfg.teacher_temperature,
            max_new_tokens=self.cfg.max_new_tokens,
        )
        response_ids = seqs[:, prompt_ids.size(1) :]
        response_mask = (response_ids != self.cfg.pad_token_id).float()
        attn = torch.cat([prompt_mask, response_mask.long()], dim=1)
        t_logits = self.teacher(input_ids=seqs, attention_mask=attn).logits[:, prompt_ids.size(1) - 1 : -1]
        teacher_lp = token_logps(t_logits / self.cfg.teacher_temperature, response_ids)
        return {"seqs": seqs, "attn": attn, "response_ids": response_ids, "response_mask": response_mask, "teacher_lp": teacher_lp}

    @staticmethod
    def forward_kl_loss(student_lp: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        # ok: KL001
        per_token = (batch["teacher_lp"] - student_lp) * batch["response_mask"]
        return per_token.sum(-1).mean()

    def step(self, prompt_ids, prompt_mask) -> float:
        batch = self.teacher_batch(prompt_ids, prompt_mask)
        self.student.train()
        start = prompt_ids.size(1) - 1
        s_logits = self.student(input_ids=batch["seqs"], attention_mask=batch["attn"]).logits[:, start:-1]
        student_lp = token_logps(s_logits, batch["response_ids"])
        loss = self.forward_kl_loss(student_lp, batch)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return loss.item()
