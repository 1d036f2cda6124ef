# Reviewer: a user's REINFORCE trainer with an "exact KL" option for large
# vocabularies. `vocab_chunked_kl` takes hidden states and the two lm_head
# weights and computes, at every position of the policy's own rollouts, the full
# KL(pi(.|y_<t) || pi_ref(.|y_<t)) over the vocabulary in two passes over vocab
# slices (running logsumexp, then sum_v p_v (log p_v - log q_v)), never holding
# [B, T, V]. The per-position KLs are summed over the response and averaged.
# Verdict: BUG (KL003). Each position's exact KL has the right gradient for that
# position alone; summed over positions of sampled responses it is the
# token-level (partial) gradient of the sequence KL(pi||pi_ref): it ignores how a
# token steers the KL of the tokens after it.
from dataclasses import dataclass

import torch


@dataclass
class ExactKLConfig:
    kl_coef: float = 0.02
    vocab_chunk: int = 2
    use_exact_kl: bool = True


def _running_lse(hidden, weight, vocab_chunk):
    lse = None
    for w in weight.split(vocab_chunk, dim=0):
        part = torch.logsumexp(hidden @ w.t(), dim=-1)
        lse = part if lse is None else torch.logaddexp(lse, part)
    return lse


def vocab_chunked_kl(hidden, weight, ref_hidden, ref_weight, vocab_chunk=2):
    """KL(pi||pi_ref) at every position, over the whole vocabulary, chunked on V."""
    lse = _running_lse(hidden, weight, vocab_chunk)
    with torch.no_grad():
        ref_lse = _running_lse(ref_hidden, ref_weight, vocab_chunk)
    kl = hidden.new_zeros(hidden.shape[:-1])
    for w, rw in zip(weight.split(vocab_chunk, dim=0), ref_weight.split(vocab_chunk, dim=0)):
        logp = hidden @ w.t() - lse.unsqueeze(-1)
        with torch.no_grad():
            ref_logp = ref_hidden @ rw.t() - ref_lse.unsqueeze(-1)
        # error: KL003
        kl = kl + (logp.exp() * (logp - ref_logp)).sum(-1)
    return kl


def token_logps(hidden, weight, labels):
    logits = hidden @ weight.t()
    return logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def reinforce_loss(hidden, weight, ref_hidden, ref_weight, labels, mask, rewards, cfg):
    logps = token_logps(hidden, weight, labels)
    seq_logps = (logps * mask).sum(-1)
    baseline = rewards.mean() if rewards.numel() > 1 else rewards.new_zeros(())
    pg_loss = -((rewards - baseline) * seq_logps).mean()
    if cfg.use_exact_kl:
        per_pos_kl = vocab_chunked_kl(hidden, weight, ref_hidden, ref_weight, cfg.vocab_chunk)
        kl_loss = (per_pos_kl * mask).sum(-1).mean()
    else:
        kl_loss = pg_loss.new_zeros(())
    loss = pg_loss + cfg.kl_coef * kl_loss
    return loss, {"pg_loss": pg_loss.item(), "kl": kl_loss.item()}
