"""Sequence-level score-function KL penalty, with conventional names."""
import torch


def completion_logps(model, input_ids, completion_ids):
    logits = model(input_ids).logits[:, -completion_ids.shape[1] - 1 : -1]
    return torch.gather(logits.log_softmax(-1), 2, completion_ids.unsqueeze(-1)).squeeze(-1)


def compute_loss(model, ref_model, input_ids, completion_ids, completion_mask, advantages, beta=0.05):
    per_token_logps = completion_logps(model, input_ids, completion_ids)
    with torch.no_grad():
        ref_per_token_logps = completion_logps(ref_model, input_ids, completion_ids)
    seq_logps = (per_token_logps * completion_mask).sum(dim=1)
    # ok: KL001, KL003
    seq_log_ratio = ((per_token_logps - ref_per_token_logps) * completion_mask).sum(dim=1).detach()
    pg_loss = -(advantages * seq_logps).mean()
    kl_loss = (seq_log_ratio * seq_logps).mean()
    return pg_loss + beta * kl_loss


def training_step(model, ref_model, accelerator, optimizer, batch):
    loss = compute_loss(model, ref_model, batch["input_ids"], batch["completion_ids"], batch["completion_mask"], batch["advantages"])
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
