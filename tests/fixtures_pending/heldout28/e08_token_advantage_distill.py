"""On-policy distillation recipe: sample from the student, score every sampled
token with the teacher, and use the negative per-token reverse KL as the
advantage of an importance-sampled policy-gradient loss."""

import torch
import torch.nn.functional as F


def token_logprobs(model, input_ids, completion_ids):
    logits = model(input_ids=input_ids).logits[:, -completion_ids.size(1) - 1 : -1]
    return torch.gather(F.log_softmax(logits, dim=-1), -1, completion_ids.unsqueeze(-1)).squeeze(-1)


class OnPolicyDistillation:
    def __init__(self, student, teacher, kl_penalty_coef=1.0):
        self.student = student
        self.teacher = teacher
        self.kl_penalty_coef = kl_penalty_coef

    def incorporate_kl_penalty(self, batch, student_logprobs):
        with torch.no_grad():
            teacher_logprobs = token_logprobs(self.teacher, batch["input_ids"], batch["completion_ids"])
            mask = batch["completion_mask"]
            # error: KL003
            reverse_kl = (student_logprobs.detach() - teacher_logprobs) * mask
            advantages = batch["advantages"].unsqueeze(1) * mask - self.kl_penalty_coef * reverse_kl
        return advantages

    def compute_loss(self, batch):
        student_logprobs = token_logprobs(self.student, batch["input_ids"], batch["completion_ids"])
        advantages = self.incorporate_kl_penalty(batch, student_logprobs)
        sampling_logprobs = batch["sampling_logprobs"]
        ratio = torch.exp(student_logprobs - sampling_logprobs)
        mask = batch["completion_mask"]
        loss = -(ratio * advantages * mask).sum() / mask.sum().clamp(min=1.0)
        return loss
