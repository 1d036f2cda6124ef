# Reviewer: on-policy distillation towards a frozen base model used as the KL
# anchor, in the style of a TRL GKD / on-policy distillation trainer, written
# with torch.func. The student samples its own responses; `position_kl`
# (given only logits) maps, with `vmap` over positions, the exact KL over the
# vocabulary, sum_v p_v (log p_v - log q_v) = KL(pi||pi_ref) at that position,
# and the loss sums it over the response positions and averages over samples.
# Verdict: BUG (KL003). On the student's own samples, the per-position exact KL
# summed over positions is only the token-level (partial) gradient of the
# sequence KL(pi||pi_ref): how a token steers the later positions is missing.
from dataclasses import dataclass

import torch
from torch.func import functional_call, vmap


@dataclass
class DistillConfig:
    kl_weight: float = 1.0
    temperature: float = 1.0
    seq_kd_weight: float = 0.0


def position_kl(student_logits, anchor_logits, temperature=1.0):
    def one(s, a):
        s_lp = (s / temperature).log_softmax(-1)
        a_lp = (a / temperature).log_softmax(-1)
        # error: KL003
        return (s_lp.exp() * (s_lp - a_lp)).sum(-1)

    return vmap(one)(student_logits, anchor_logits)


def distill_loss(student, params, anchor_logits, batch, cfg: DistillConfig):
    mask = batch["response_mask"]
    T = mask.shape[1]
    logits = functional_call(student, params, (batch["input_ids"],)).logits[:, -T - 1 : -1]
    B = logits.shape[0]
    kl = position_kl(logits.reshape(B * T, -1), anchor_logits.reshape(B * T, -1), cfg.temperature).view(B, T)
    loss = cfg.kl_weight * (kl * mask).sum(-1).mean()
    if cfg.seq_kd_weight > 0:
        nll = -torch.gather(logits.log_softmax(-1), -1, batch["teacher_ids"][..., None]).squeeze(-1)
        loss = loss + cfg.seq_kd_weight * (nll * mask).sum(-1).mean()
    return loss, {"kl_per_token": ((kl * mask).sum() / mask.sum()).item()}


def training_step(student, params, anchor, anchor_params, optimizer, batch, cfg: DistillConfig):
    with torch.no_grad():
        T = batch["response_mask"].shape[1]
        anchor_logits = functional_call(anchor, anchor_params, (batch["input_ids"],)).logits[:, -T - 1 : -1]
    optimizer.zero_grad()
    loss, metrics = distill_loss(student, params, anchor_logits, batch, cfg)
    loss.backward()
    optimizer.step()
    return metrics
