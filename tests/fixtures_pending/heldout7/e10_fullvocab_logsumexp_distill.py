"""On-policy knowledge distillation (GKD-style, student-generated data) with the exact reverse
KL of every next-token distribution, normalised with `logsumexp`.

What it shows: at each response position the loss computes sum_v p(v) (log p(v) - log q(v)),
the exact KL(pi_student||pi_teacher) of that position's next-token distribution, and averages it
over the positions of the student's sampled responses. Each position's term is exact, but the
prefixes were sampled from the student: summing them ignores how each token changes which later
prefixes are visited, so the gradient is the token-level partial gradient of the sequence
KL(pi||pi_T), lacking E[sum_t grad log pi(y_t) * sum_{s>t} KL_s] (KL003).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class GKDArgs:
    temperature: float = 0.9
    max_new_tokens: int = 256
    lmbda: float = 1.0  # fraction of on-policy (student-generated) batches
    learning_rate: float = 5e-7


def log_normalize(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    z = logits.float() / temperature
    return z - torch.logsumexp(z, dim=-1, keepdim=True)


class OnPolicyGKDTrainer:
    def __init__(self, student, teacher, optimizer, args: GKDArgs, pad_token_id: int):
        self.student = student
        self.teacher = teacher.eval().requires_grad_(False)
        self.optimizer = optimizer
        self.args = args
        self.pad_token_id = pad_token_id

    def distill_loss(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        s_logp = log_normalize(student_logits, self.args.temperature)
        t_logp = log_normalize(teacher_logits, self.args.temperature).detach()
        # error: KL003
        per_pos_kl = (s_logp.exp() * (s_logp - t_logp)).sum(-1)
        per_seq = (per_pos_kl * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        return per_seq.mean()

    @torch.no_grad()
    def generate(self, prompt_ids, prompt_mask):
        self.student.eval()
        out = self.student.generate(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            do_sample=True,
            temperature=self.args.temperature,
            max_new_tokens=self.args.max_new_tokens,
        )
        completion = out[:, prompt_ids.size(1) :]
        mask = (completion != self.pad_token_id).float()
        return out, torch.cat([prompt_mask, mask.long()], dim=1), mask

    def training_step(self, prompt_ids, prompt_mask) -> dict[str, float]:
        seqs, attn, mask = self.generate(prompt_ids, prompt_mask)
        start = prompt_ids.size(1) - 1
        with torch.no_grad():
            teacher_logits = self.teacher(input_ids=seqs, attention_mask=attn).logits[:, start:-1]
        self.student.train()
        student_logits = self.student(input_ids=seqs, attention_mask=attn).logits[:, start:-1]
        loss = self.distill_loss(student_logits, teacher_logits, mask)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.student.parameters(), 1.0)
        self.optimizer.step()
        return {"loss": loss.item(), "mean_len": mask.sum(-1).mean().item()}
