# Reviewer: an RLOO-style trainer (open-instruct flavour) with a per-sample
# loss mapped by `torch.func.vmap` and differentiated by `torch.func.grad`.
# Each sample's sequence log-ratio is summed over its response first, and the
# KL penalty is k2 of that sequence log-ratio, `0.5 * seq_log_ratio ** 2`: the
# right estimator. But `loss_fn` returns `pg_loss - kl_coef * kl_penalty`, the
# penalty subtracted as if the loss were an objective, and the step descends it.
# Verdict: BUG (KL006). The KL term's expected gradient is
# -kl_coef * grad KL(pi||pi_ref): gradient descent increases the KL.
import torch
from torch.func import functional_call, grad, vmap


class RLOOArgs:
    kl_coef = 0.05
    learning_rate = 3e-7
    rloo_k = 4


def sample_terms(model, params, input_ids, mask, ref_logp):
    T = mask.shape[-1]
    logits = functional_call(model, params, (input_ids[None],)).logits[0, -T - 1 : -1]
    logp = torch.gather(logits.log_softmax(-1), -1, input_ids[-T:, None]).squeeze(-1)
    seq_logp = (logp * mask).sum()
    seq_log_ratio = ((logp - ref_logp) * mask).sum()
    return seq_logp, seq_log_ratio


def loss_fn(params, model, batch, args=RLOOArgs):
    seq_logp, seq_log_ratio = vmap(sample_terms, in_dims=(None, None, 0, 0, 0))(
        model, params, batch["input_ids"], batch["response_mask"], batch["ref_log_probs"]
    )
    pg_loss = -(batch["advantages"] * seq_logp).mean()
    # error: KL006
    kl_penalty = 0.5 * (seq_log_ratio**2).mean()
    return pg_loss - args.kl_coef * kl_penalty


def rloo_advantages(scores, k):
    s = scores.view(k, -1)
    baseline = (s.sum(0, keepdim=True) - s) / (k - 1)
    return (s - baseline).flatten()


def train_step(model, params, batch, args=RLOOArgs):
    batch = dict(batch)
    batch["advantages"] = rloo_advantages(batch["scores"], args.rloo_k)
    grads = grad(loss_fn)(params, model, batch, args)
    return {k: p - args.learning_rate * grads[k] for k, p in params.items()}
