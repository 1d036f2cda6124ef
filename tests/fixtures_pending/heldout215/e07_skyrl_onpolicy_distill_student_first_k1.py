# Reviewer: SkyRL-style ON-POLICY distillation. The student samples its own
# responses (`rollout` calls `self.student.generate`); student and teacher are
# wrapped in modules that return the same `LMOutput` dataclass (logits,
# token_log_probs). The teacher's forward is @torch.no_grad(). The loss is the
# student-first log-ratio `s_out.token_log_probs - t_out.token_log_probs`
# summed over the response and minimised: k1 of KL(student||teacher) on the
# student's own samples. Its gradient is grad log pi(y), whose expectation is
# zero: the student is not pulled toward the teacher at all.
# Verdict: bug, KL001, reported on the `per_token_kl = ...` line of distill_loss.
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from skyrl_train.training_batch import TrainingInputBatch


@dataclass
class LMOutput:
    logits: torch.Tensor
    token_log_probs: torch.Tensor


class CausalLMWrapper(nn.Module):
    def __init__(self, model, temperature=1.0):
        super().__init__()
        self.model = model
        self.temperature = temperature

    def forward(self, sequences, attention_mask, num_actions) -> LMOutput:
        logits = self.model(sequences, attention_mask=attention_mask).logits[:, -num_actions - 1 : -1]
        logits = logits / self.temperature
        lp = F.log_softmax(logits, dim=-1).gather(-1, sequences[:, -num_actions:].unsqueeze(-1)).squeeze(-1)
        return LMOutput(logits=logits, token_log_probs=lp)

    def generate(self, prompts, **kw):
        return self.model.generate(prompts, **kw)


class TeacherWrapper(CausalLMWrapper):
    @torch.no_grad()
    def forward(self, sequences, attention_mask, num_actions) -> LMOutput:
        return super().forward(sequences, attention_mask, num_actions)


class OnPolicyDistillTrainer:
    def __init__(self, student: CausalLMWrapper, teacher: TeacherWrapper, optimizer, max_new_tokens=256):
        self.student = student
        self.teacher = teacher
        self.optimizer = optimizer
        self.max_new_tokens = max_new_tokens

    @torch.no_grad()
    def rollout(self, prompts) -> dict:
        sequences, attention_mask, loss_mask = self.student.generate(prompts, max_new_tokens=self.max_new_tokens, do_sample=True)
        return {"sequences": sequences, "attention_mask": attention_mask, "loss_mask": loss_mask}

    def distill_loss(self, batch):
        mask = batch["loss_mask"]
        num_actions = mask.shape[1]
        s_out = self.student(batch["sequences"], batch["attention_mask"], num_actions)
        t_out = self.teacher(batch["sequences"], batch["attention_mask"], num_actions)
        # error: KL001
        per_token_kl = s_out.token_log_probs - t_out.token_log_probs
        return (per_token_kl * mask).sum(-1).mean()

    def train_step(self, prompts: TrainingInputBatch):
        batch = self.rollout(prompts)
        loss = self.distill_loss(batch)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {"distill/kl": loss.item()}
