# Reviewer: a generalised Jensen-Shannon distillation loss in the style of TRL's GKD,
# used here only on a fixed dataset of teacher-written responses (lmbda = 0, no student
# generations). The mixture m = beta * teacher + (1 - beta) * student is formed in log
# space with torch.logaddexp, then beta * KL(teacher||m) + (1 - beta) * KL(student||m)
# via F.kl_div(..., log_target=True) (input = log m, target = each distribution).
# Verdict: CORRECT. Every term is an exact divergence over the vocabulary at a prefix
# drawn from the data, which does not depend on the student: the gradient is exactly
# the gradient of E_data[sum_t JSD_beta,t], the objective the code writes.
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from trl import SFTTrainer


@dataclass
class JSDConfig:
    beta: float = 0.5
    temperature: float = 1.0
    lmbda: float = 0.0
    seq_kd: bool = False


def generalized_jsd_loss(student_logits, teacher_logits, labels_mask, beta=0.5, temperature=1.0):
    student_logp = F.log_softmax(student_logits / temperature, dim=-1)
    teacher_logp = F.log_softmax(teacher_logits / temperature, dim=-1)
    if beta == 0.0:
        jsd = F.kl_div(student_logp, teacher_logp, reduction="none", log_target=True)
    elif beta == 1.0:
        jsd = F.kl_div(teacher_logp, student_logp, reduction="none", log_target=True)
    else:
        log_mix = torch.logaddexp(teacher_logp + math.log(beta), student_logp + math.log(1 - beta))
        kl_teacher = F.kl_div(log_mix, teacher_logp, reduction="none", log_target=True)
        kl_student = F.kl_div(log_mix, student_logp, reduction="none", log_target=True)
        jsd = beta * kl_teacher + (1 - beta) * kl_student
    # ok: KL003
    per_pos = jsd.sum(-1) * labels_mask
    return per_pos.sum(-1).mean()


class OfflineGKDTrainer(SFTTrainer):
    def __init__(self, teacher_model, jsd_args: JSDConfig, **kwargs):
        super().__init__(**kwargs)
        self.teacher_model = teacher_model
        self.jsd_args = jsd_args

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs["labels"]
        shifted_mask = (labels[:, 1:] != -100).float()
        student_logits = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits[:, :-1]
        with torch.no_grad():
            teacher_logits = self.teacher_model(input_ids=inputs["input_ids"],
                                                attention_mask=inputs["attention_mask"]).logits[:, :-1]
        loss = generalized_jsd_loss(student_logits, teacher_logits, shifted_mask,
                                    beta=self.jsd_args.beta, temperature=self.jsd_args.temperature)
        return (loss, student_logits) if return_outputs else loss
