"""Packed (unpadded) sequences: per-sample log-probs as a list, k2 penalty (slime-like)."""
import torch


def per_sample_logprobs(model, packed_ids, cu_seqlens, response_lengths):
    logits = model(packed_ids.unsqueeze(0)).logits.squeeze(0)
    logp_all = torch.log_softmax(logits[:-1].float(), dim=-1)
    tok = torch.gather(logp_all, -1, packed_ids[1:].unsqueeze(-1)).squeeze(-1)
    out = []
    for i, rlen in enumerate(response_lengths):
        end = int(cu_seqlens[i + 1]) - 1
        out.append(tok[end - rlen : end])
    return out


def policy_loss(model, ref_model, packed_ids, cu_seqlens, response_lengths, advantages, kl_coef=0.02):
    policy_lps = per_sample_logprobs(model, packed_ids, cu_seqlens, response_lengths)
    with torch.no_grad():
        ref_lps = per_sample_logprobs(ref_model, packed_ids, cu_seqlens, response_lengths)
    pg_terms = [-(adv * lp.sum()) for adv, lp in zip(advantages, policy_lps)]
    # error: KL003
    kl_terms = [(0.5 * (lp - lq) ** 2).sum() for lp, lq in zip(policy_lps, ref_lps)]
    loss = torch.stack(pg_terms).mean() + kl_coef * torch.stack(kl_terms).mean()
    return loss


def train_step(model, ref_model, optimizer, batch):
    loss = policy_loss(model, ref_model, batch["tokens"], batch["cu_seqlens"], batch["response_lengths"], batch["advantages"])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
