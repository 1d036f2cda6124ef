"""Packed varlen batch: log-ratio masked with torch.where, summed per cu_seqlens segment, then squared (sequence k2)."""
import torch


def packed_logprobs(logits, input_ids, cu_seqlens):
    # logits: [total_tokens, vocab]; the label of each position is the next token of its segment
    labels = torch.roll(input_ids, shifts=-1, dims=0)
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    valid = torch.ones_like(logp, dtype=torch.bool)
    valid[cu_seqlens[1:] - 1] = False
    return logp, valid


def segment_sum(values, cu_seqlens):
    num_seqs = cu_seqlens.numel() - 1
    seq_ids = torch.repeat_interleave(torch.arange(num_seqs, device=values.device), cu_seqlens.diff())
    return values.new_zeros(num_seqs).index_add(0, seq_ids, values)


def packed_kl_loss(logp, ref_logp, loss_mask, cu_seqlens):
    token_log_ratio = torch.where(loss_mask, logp - ref_logp, torch.zeros_like(logp))
    seq_log_ratio = segment_sum(token_log_ratio, cu_seqlens)
    # ok: KL001,KL003
    seq_kl = 0.5 * seq_log_ratio.pow(2)
    return seq_kl.mean()


def packed_pg_loss(logp, advantages, loss_mask, cu_seqlens):
    seq_logp = segment_sum(torch.where(loss_mask, logp, torch.zeros_like(logp)), cu_seqlens)
    return -(advantages * seq_logp).mean()


def train_micro_batch(model, ref_model, optimizer, batch, kl_coef=0.05):
    cu_seqlens = batch["cu_seqlens"]
    logits = model(batch["input_ids"].unsqueeze(0), cu_seqlens=cu_seqlens).logits.squeeze(0)
    logp, valid = packed_logprobs(logits, batch["input_ids"], cu_seqlens)
    with torch.no_grad():
        ref_logits = ref_model(batch["input_ids"].unsqueeze(0), cu_seqlens=cu_seqlens).logits.squeeze(0)
        ref_logp, _ = packed_logprobs(ref_logits, batch["input_ids"], cu_seqlens)
    loss_mask = valid & batch["response_mask"].bool()
    loss = packed_pg_loss(logp, batch["advantages"], loss_mask, cu_seqlens)
    loss = loss + kl_coef * packed_kl_loss(logp, ref_logp, loss_mask, cu_seqlens)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()
