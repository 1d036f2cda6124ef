"""RLHF regulariser as the exact full-vocabulary KL at each sampled position, summed."""
import torch
import torch.nn.functional as F


def rlhf_step(policy, ref_policy, optimizer, input_ids, resp_mask, advantages, beta=0.1):
    n = resp_mask.size(1)
    logits = policy(input_ids).logits[:, -n - 1 : -1]
    logp_all = F.log_softmax(logits, dim=-1)
    with torch.no_grad():
        ref_logp_all = F.log_softmax(ref_policy(input_ids).logits[:, -n - 1 : -1], dim=-1)
    token_logp = logp_all.gather(-1, input_ids[:, -n:].unsqueeze(-1)).squeeze(-1)
    pg_loss = -(advantages[:, None] * token_logp * resp_mask).sum(-1).mean()
    # error: KL003
    kl_per_pos = (logp_all.exp() * (logp_all - ref_logp_all)).sum(-1)
    kl_loss = (kl_per_pos * resp_mask).sum(-1).mean()
    loss = pg_loss + beta * kl_loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
