"""An objective that is maximised (loss = -objective), and a KL reward subtracted."""
import torch


def seq_logps(model, ids, mask):
    n = mask.size(1)
    logits = model(ids).logits[:, -n - 1 : -1]
    tok = logits.log_softmax(-1).gather(-1, ids[:, -n:].unsqueeze(-1)).squeeze(-1)
    return (tok * mask).sum(-1)


def compute_loss(model, ref_model, ids, mask, scores, group=4, beta=0.05, tau=0.02):
    logp = seq_logps(model, ids, mask)
    with torch.no_grad():
        ref_logp = seq_logps(ref_model, ids, mask)
        # ok: KL006, KL004, KL005
        r = scores - tau * (logp - ref_logp)
        r = r.view(-1, group)
        adv = (r - (r.sum(1, keepdim=True) - r) / (group - 1)).flatten()
    # ok: KL003
    kl = 0.5 * (logp - ref_logp) ** 2
    # ok: KL006
    objective = (adv * logp).mean() - beta * kl.mean()
    return -objective


def train(model, ref_model, optimizer, batches):
    for b in batches:
        loss = compute_loss(model, ref_model, b["ids"], b["mask"], b["scores"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
