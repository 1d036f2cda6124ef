# Reviewer: AReaL-style PPO actor with an "exact" KL regulariser: instead of a
# sampled estimate, it computes sum_v p_v (log p_v - log q_v) over the whole
# vocabulary at every position of the policy's own rollout, in two chunked passes
# over the vocabulary (logsumexp first, then the KL) to avoid a second [B, T, V]
# fp32 copy. The per-position KL is exact and differentiated, but summed over the
# positions of a sampled sequence it is the token-level (partial) gradient of the
# sequence KL(pi||pi_ref): it ignores how each token steers the later positions.
# The helper is given only logits and forms the log-probs and the KL itself.
# Verdict: BUG (KL003), reported inside the helper, on the line that accumulates
# the per-position KL.
import torch
from realhf.base import stats_tracker


def _chunked_logsumexp(logits, vocab_chunk):
    parts = [logits[..., s : s + vocab_chunk].float().logsumexp(-1) for s in range(0, logits.size(-1), vocab_chunk)]
    return torch.stack(parts, -1).logsumexp(-1)


def chunked_vocab_kl(logits, ref_logits, vocab_chunk: int = 8192):
    """Exact KL(pi||pi_ref) at each position, [B, T, V] -> [B, T]."""
    lse = _chunked_logsumexp(logits, vocab_chunk)
    ref_lse = _chunked_logsumexp(ref_logits, vocab_chunk)
    kl = torch.zeros_like(lse)
    for s in range(0, logits.size(-1), vocab_chunk):
        lp_c = logits[..., s : s + vocab_chunk].float() - lse[..., None]
        ref_lp_c = ref_logits[..., s : s + vocab_chunk].float() - ref_lse[..., None]
        # error: KL003
        kl = kl + (lp_c.exp() * (lp_c - ref_lp_c)).sum(-1)
    return kl


def ppo_actor_loss_fn(logits, ref_logits, input_ids, old_logp, advantages, loss_mask, eps_clip=0.2, kl_ctl=0.02):
    logprobs = torch.gather(logits.float().log_softmax(-1), -1, input_ids[..., None]).squeeze(-1)
    ratio = torch.exp(logprobs - old_logp)
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1.0 - eps_clip, 1.0 + eps_clip)
    pg_loss = torch.max(pg_loss1, pg_loss2)

    kl = chunked_vocab_kl(logits, ref_logits)
    per_seq = ((pg_loss + kl_ctl * kl) * loss_mask).sum(-1)
    loss = per_seq.mean()

    stats_tracker.stat(
        exact_kl=(kl.detach() * loss_mask).sum() / loss_mask.sum(),
        clip_ratio=((pg_loss2 > pg_loss1).float() * loss_mask).sum() / loss_mask.sum(),
    )
    return loss


class PPOActorInterface:
    def __init__(self, engine, ref_engine, eps_clip=0.2, kl_ctl=0.02, n_minibatches=4):
        self.engine, self.ref_engine = engine, ref_engine
        self.eps_clip, self.kl_ctl, self.n_minibatches = eps_clip, kl_ctl, n_minibatches

    def train_step(self, data):
        for mb in data.split(self.n_minibatches):
            logits = self.engine.forward(mb["input_ids"], mb["attention_mask"])
            with torch.no_grad():
                ref_logits = self.ref_engine.forward(mb["input_ids"], mb["attention_mask"])
            loss = ppo_actor_loss_fn(
                logits, ref_logits, mb["target_ids"], mb["old_logp"], mb["advantages"], mb["loss_mask"],
                eps_clip=self.eps_clip, kl_ctl=self.kl_ctl,
            )
            self.engine.backward(loss)
        self.engine.step()
