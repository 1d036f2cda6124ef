"""Loss built by a closure factory; sequence-level k2 penalty with the wrong sign."""
import torch


def sequence_logps(model, input_ids, completion_ids, mask):
    logits = model(input_ids).logits[:, -completion_ids.size(1) - 1 : -1]
    tok = logits.log_softmax(-1).gather(2, completion_ids.unsqueeze(-1)).squeeze(-1)
    return tok * mask


def make_loss_fn(ref_model, beta):
    def loss_fn(model, input_ids, completion_ids, mask, advantages):
        lp = sequence_logps(model, input_ids, completion_ids, mask)
        with torch.no_grad():
            lq = sequence_logps(ref_model, input_ids, completion_ids, mask)
        pg_loss = -(advantages * lp.sum(-1)).mean()
        seq_lr = (lp - lq).sum(-1)
        kl = 0.5 * (seq_lr**2).mean()
        # error: KL006
        return pg_loss - beta * kl

    return loss_fn


def train(model, ref_model, optimizer, loader, beta=0.1):
    loss_fn = make_loss_fn(ref_model, beta)
    for batch in loader:
        loss = loss_fn(model, batch["input_ids"], batch["completion_ids"], batch["mask"], batch["advantages"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
