"""KL used twice: as a reward (fine) and again as a loss through functools.partial."""
import functools

import torch


def compute_kl(logp, ref_logp, estimator="k3"):
    lr = logp - ref_logp
    if estimator == "k1":
        return lr
    if estimator == "k2":
        return 0.5 * lr * lr
    return torch.exp(-lr) + lr - 1


def response_logprobs(model, ids, resp_len):
    logits = model(ids).logits[:, -resp_len - 1 : -1]
    return logits.log_softmax(-1).gather(-1, ids[:, -resp_len:].unsqueeze(-1)).squeeze(-1)


kl_fn = functools.partial(compute_kl, estimator="k1")


def ppo_step(policy, ref, optimizer, ids, resp_len, mask, scores, beta=0.02, loss_beta=0.01):
    logp = response_logprobs(policy, ids, resp_len)
    with torch.no_grad():
        ref_logp = response_logprobs(ref, ids, resp_len)
        # ok: KL001
        token_rewards = -beta * kl_fn(logp, ref_logp) * mask
        token_rewards[:, -1] += scores
        returns = token_rewards.flip(-1).cumsum(-1).flip(-1)
    pg_loss = -(returns * logp * mask).sum(-1).mean()
    # error: KL001
    kl_loss = (kl_fn(logp, ref_logp) * mask).sum(-1).mean()
    loss = pg_loss + loss_beta * kl_loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
