"""AMP step with GradScaler: token log-probs via einsum over one-hot minus logsumexp, k2 of the masked sequence log-ratio."""
import torch
import torch.nn.functional as F


def einsum_logprobs(logits, labels):
    onehot = F.one_hot(labels, num_classes=logits.size(-1)).to(logits.dtype)
    picked = torch.einsum("btv,btv->bt", logits, onehot)
    return picked - torch.logsumexp(logits, dim=-1)


def kl_regularized_loss(logits, ref_logits, labels, mask, advantages, kl_coef):
    logp = einsum_logprobs(logits.float(), labels)
    ref_logp = einsum_logprobs(ref_logits.float(), labels)
    seq_logp = torch.einsum("bt,bt->b", logp, mask)
    pg_loss = -(advantages * seq_logp).mean()
    seq_log_ratio = torch.einsum("bt,bt->b", logp - ref_logp, mask)
    # ok: KL001,KL003
    kl_loss = 0.5 * seq_log_ratio.square().mean()
    return pg_loss + kl_coef * kl_loss, kl_loss.detach()


def train_epoch(model, ref_model, loader, optimizer, kl_coef=0.02):
    scaler = torch.cuda.amp.GradScaler()
    model.train()
    for batch in loader:
        labels = batch["input_ids"][:, 1:]
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            logits = model(batch["input_ids"]).logits[:, :-1]
            with torch.no_grad():
                ref_logits = ref_model(batch["input_ids"]).logits[:, :-1]
            loss, kl = kl_regularized_loss(logits, ref_logits, labels, batch["mask"], batch["advantages"], kl_coef)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
