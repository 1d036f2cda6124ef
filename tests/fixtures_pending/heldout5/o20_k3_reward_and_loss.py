"""k3 in the per-token reward (with returns) AND as a token loss, same beta: correct together."""
import torch


def lp_of(model, ids, n):
    logits = model(ids).logits[:, -n - 1 : -1]
    return torch.gather(logits.log_softmax(-1), 2, ids[:, -n:].unsqueeze(-1)).squeeze(-1)


def step(policy, ref, optimizer, ids, mask, scores, beta=0.05):
    n = mask.size(1)
    logp = lp_of(policy, ids, n)
    with torch.no_grad():
        ref_logp = lp_of(ref, ids, n)
        lr = logp - ref_logp
        # ok: KL004
        k3_reward = torch.exp(-lr) + lr - 1
        rewards = -beta * k3_reward * mask
        last = mask.sum(1).long() - 1
        rewards[torch.arange(rewards.size(0)), last] += scores
        returns = rewards.flip(-1).cumsum(-1).flip(-1)
    pg_loss = -(returns * logp * mask).sum(-1).mean()
    # ok: KL002, KL003
    k3_loss = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
    loss = pg_loss + beta * (k3_loss * mask).sum(-1).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
