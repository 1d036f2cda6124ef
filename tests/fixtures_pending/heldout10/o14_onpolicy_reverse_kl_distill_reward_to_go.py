"""On-policy distillation with the per-token reverse KL against a teacher as the reward:
the student samples (through an sglang engine that returns detached log-probs), the
teacher scores the tokens, and each token's advantage is minus the *reward-to-go* of the
log-ratio, G_t = sum_{s>=t} (student_s - teacher_s).  The surrogate's gradient is
E[sum_t G_t grad logp_t] = grad KL(student||teacher) of the sequence.  Not a bug.
"""
import torch


def reverse_cumsum(x: torch.Tensor) -> torch.Tensor:
    return x.flip(-1).cumsum(-1).flip(-1)


def token_logprobs(model, ids):
    return model(ids).logits.log_softmax(-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)


class OnPolicyDistiller:
    def __init__(self, student, teacher, kl_coef: float = 1.0):
        self.student = student
        self.teacher = teacher
        self.kl_coef = kl_coef

    @torch.no_grad()
    def advantages(self, ids, engine_logprobs, mask):
        teacher_lp = token_logprobs(self.teacher, ids)
        # ok: KL003
        per_token_reverse_kl = (engine_logprobs - teacher_lp) * mask
        return -self.kl_coef * reverse_cumsum(per_token_reverse_kl) * mask

    def loss(self, ids, engine_logprobs, mask, advantages):
        logp = token_logprobs(self.student, ids)
        ratio = torch.exp(logp - engine_logprobs)
        return -(ratio * advantages * mask).sum(-1).mean()

    def step(self, ids, engine_logprobs, mask, optimizer):
        adv = self.advantages(ids, engine_logprobs, mask)
        loss = self.loss(ids, engine_logprobs, mask, adv)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.detach()
