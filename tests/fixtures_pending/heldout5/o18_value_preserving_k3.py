"""k3 kept as the logged value, gradient from the reward-to-go of the log-ratio."""
import torch


def logprobs(model, ids, resp_len):
    out = model(ids).logits[:, -resp_len - 1 : -1]
    return out.log_softmax(-1).gather(-1, ids[:, -resp_len:].unsqueeze(-1)).squeeze(-1)


def kl_term(log_prob, ref_log_prob, mask, kind="low_var_kl"):
    lr = (log_prob - ref_log_prob).detach() * mask
    if kind == "low_var_kl":
        value = torch.exp(-lr) + lr - 1
    elif kind == "kl":
        value = lr
    else:
        value = 0.5 * lr**2
    g = lr.flip(-1).cumsum(-1).flip(-1)
    return value + g * (log_prob - log_prob.detach())


def actor_loss(model, ref_model, ids, resp_len, mask, advantages, kl_coef=0.01, kl_type="low_var_kl"):
    log_prob = logprobs(model, ids, resp_len)
    with torch.no_grad():
        ref_log_prob = logprobs(ref_model, ids, resp_len)
    pg_loss = -(advantages[:, None] * log_prob * mask).sum(-1).mean()
    # ok: KL002, KL001, KL003
    kld = kl_term(log_prob, ref_log_prob, mask, kind=kl_type)
    kl_loss = (kld * mask).sum(-1).mean()
    return pg_loss + kl_coef * kl_loss


def train_step(model, ref_model, optimizer, batch):
    loss = actor_loss(model, ref_model, batch["ids"], batch["resp_len"], batch["mask"], batch["adv"])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
