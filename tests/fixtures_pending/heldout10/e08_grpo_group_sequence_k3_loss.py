"""GRPO variant that computes the KL "once per prompt group": the sequence log-ratio of
each sample, then the low-variance k3 of it, averaged over the G samples of the group and
added to the loss.  k3 of the sequence log-ratio differentiated as a loss has gradient
(1 - exp(-X)) grad log pi(y) with X = sum_t x_t, whose expectation is grad
KL(pi_ref||pi) of the sequence, the swapped divergence (KL002, at the k3 line).
"""
import torch


def sequence_logratio(logp, ref_logp, mask):
    return ((logp - ref_logp) * mask).sum(-1)


def group_kl(seq_log_ratio, group_size):
    x = seq_log_ratio.view(-1, group_size)
    # error: KL002
    k3 = torch.exp(-x) - 1.0 + x
    return k3.mean(dim=-1)


def grpo_loss(logp, old_logp, ref_logp, rewards, mask, group_size, beta=0.04, eps=0.2):
    r = rewards.view(-1, group_size)
    adv = ((r - r.mean(-1, keepdim=True)) / (r.std(-1, keepdim=True) + 1e-4)).view(-1, 1)
    ratio = torch.exp(logp - old_logp)
    pg = -torch.min(ratio * adv, torch.clamp(ratio, 1 - eps, 1 + eps) * adv)
    pg_loss = ((pg * mask).sum(-1) / mask.sum(-1)).mean()
    kl_per_group = group_kl(sequence_logratio(logp, ref_logp, mask), group_size)
    return pg_loss + beta * kl_per_group.mean()


def step(model, ref_model, batch, optimizer, group_size=8):
    ids = batch["input_ids"]
    logp = model(ids).logits.log_softmax(-1).gather(-1, ids[..., None]).squeeze(-1)
    with torch.no_grad():
        ref_logp = ref_model(ids).logits.log_softmax(-1).gather(-1, ids[..., None]).squeeze(-1)
    loss = grpo_loss(logp, batch["old_logp"], ref_logp, batch["rewards"], batch["mask"], group_size)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
