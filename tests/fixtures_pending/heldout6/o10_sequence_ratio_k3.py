"""Sequence-level importance-weighted k3: exp(seq_logp - sg(seq_logp)) times k3 of the summed sequence log-ratio."""
import torch


def sequence_kl_loss(logp, ref_logp, mask):
    seq_logp = (logp * mask).sum(-1)
    seq_ref_logp = (ref_logp * mask).sum(-1)
    seq_ratio = torch.exp(seq_logp - seq_logp.detach())
    log_r = seq_ref_logp - seq_logp
    # ok: KL002,KL003
    seq_kl = seq_ratio * (torch.exp(log_r) - log_r - 1)
    return seq_kl.mean()


def compute_loss(model, ref_model, batch, beta=0.05):
    logits = model(batch["input_ids"]).logits[:, :-1]
    logp = torch.log_softmax(logits.float(), -1).gather(-1, batch["labels"].unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        ref_logits = ref_model(batch["input_ids"]).logits[:, :-1]
        ref_logp = torch.log_softmax(ref_logits.float(), -1).gather(-1, batch["labels"].unsqueeze(-1)).squeeze(-1)
    mask = batch["completion_mask"]
    advantages = batch["advantages"]
    pg_loss = -(advantages * (logp * mask).sum(-1)).mean()
    return pg_loss + beta * sequence_kl_loss(logp, ref_logp, mask)


def train(model, ref_model, optimizer, loader):
    for batch in loader:
        loss = compute_loss(model, ref_model, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
