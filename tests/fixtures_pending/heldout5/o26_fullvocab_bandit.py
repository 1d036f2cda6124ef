"""Single-step (one action) classifier-policy: the exact KL of the one next-token distribution."""
import torch
import torch.nn.functional as F


def bandit_step(policy, ref_policy, optimizer, prompt_ids, action, reward, beta=0.1):
    logits = policy(prompt_ids).logits[:, -1, :]
    logp_all = F.log_softmax(logits, dim=-1)
    with torch.no_grad():
        ref_logp_all = F.log_softmax(ref_policy(prompt_ids).logits[:, -1, :], dim=-1)
    logp = logp_all.gather(-1, action.unsqueeze(-1)).squeeze(-1)
    pg_loss = -(reward * logp).mean()
    # ok: KL003
    kl = (logp_all.exp() * (logp_all - ref_logp_all)).sum(-1)
    loss = pg_loss + beta * kl.mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
