# Reviewer: sequence-level knowledge distillation (a user's trainer) on
# TEACHER samples: the teacher generated G responses per prompt offline; the
# student is trained on them. Log-probs [B*G, T] are viewed as [B, G, T] and
# the loss is the masked sum over time of teacher_lp - student_lp, averaged
# over the group. Written teacher first, on the teacher's samples, this is the
# k1 of KL(teacher||student): its gradient is -sum_t grad log student(y_t|y_<t),
# the NLL of teacher samples, whose expectation is exactly
# grad KL(teacher||student). Not a differentiated on-policy k1.
# Verdict: correct (KL001 does not apply: teacher - student, teacher samples).
import torch
from transformers import AutoModelForCausalLM  # noqa: F401


def gather_logps(logits, labels):
    return torch.gather(logits.log_softmax(-1), 2, labels.unsqueeze(-1)).squeeze(-1)


def seq_kd_loss(student_lp, teacher_lp, response_mask, num_teacher_samples):
    G = num_teacher_samples
    T = student_lp.shape[-1]
    s = student_lp.view(-1, G, T)
    t = teacher_lp.view(-1, G, T).detach()
    mask = response_mask.view(-1, G, T).to(s.dtype)
    # ok: KL001
    seq_kl = torch.einsum("bgt,bgt->bg", t - s, mask)
    loss = seq_kl.mean()
    return loss, {"kd/seq_kl": seq_kl.mean().item(), "kd/tokens": mask.sum().item()}


def distill_step(student, teacher, batch, optimizer, num_teacher_samples):
    labels = batch["response_ids"]
    student_logits = student(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    with torch.no_grad():
        teacher_logits = teacher(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    n = labels.shape[1]
    s_lp = gather_logps(student_logits[:, -n - 1 : -1], labels)
    t_lp = gather_logps(teacher_logits[:, -n - 1 : -1], labels)
    loss, metrics = seq_kd_loss(s_lp, t_lp, batch["response_mask"], num_teacher_samples)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return metrics
