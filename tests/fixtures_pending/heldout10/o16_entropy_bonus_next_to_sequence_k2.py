"""GRPO-like loss with an entropy bonus and a sequence-level k2 KL penalty (DeepSpeed-Chat
/ oat flavour).  The entropy term is subtracted on purpose (maximise entropy), and it is
no KL; the KL penalty is 0.5 * (sum_t x_t)^2 per sequence, added with a positive sign,
whose gradient sum_t grad logp_t * sum_s x_s has expectation grad KL(pi||pi_ref) of the
sequence.  Not a bug.
"""
import torch
import torch.nn.functional as F


def entropy_from_logits(logits):
    logp = F.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def policy_loss(logits, ref_logits, ids, mask, advantages, ent_coef=0.01, kl_coef=0.05):
    logp_all = F.log_softmax(logits, -1)
    logp = logp_all.gather(-1, ids[..., None]).squeeze(-1)
    ref_logp = F.log_softmax(ref_logits, -1).gather(-1, ids[..., None]).squeeze(-1)
    pg_loss = -(advantages[:, None] * logp * mask).sum(-1).mean()
    # ok: KL006
    entropy = (entropy_from_logits(logits) * mask).sum() / mask.sum()
    seq_log_ratio = ((logp - ref_logp) * mask).sum(-1)
    # ok: KL003
    kl_penalty = 0.5 * seq_log_ratio.pow(2)
    return pg_loss - ent_coef * entropy + kl_coef * kl_penalty.mean(), entropy.detach()


def step(engine, ref_model, batch, ent_coef=0.01, kl_coef=0.05):
    ids = batch["input_ids"]
    logits = engine(ids).logits
    with torch.no_grad():
        ref_logits = ref_model(ids).logits
    loss, ent = policy_loss(logits, ref_logits, ids, batch["mask"], batch["advantages"], ent_coef, kl_coef)
    engine.backward(loss)
    engine.step()
    return ent
