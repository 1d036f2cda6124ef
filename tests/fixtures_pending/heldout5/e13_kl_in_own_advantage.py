"""GRPO with the KL folded into each token's advantage (no reward-to-go)."""
import torch


def token_logps(model, input_ids, n):
    logits = model(input_ids).logits[:, -n - 1 : -1]
    return logits.log_softmax(dim=-1).gather(-1, input_ids[:, -n:, None]).squeeze(-1)


def group_advantages(scores, group_size):
    s = scores.view(-1, group_size)
    return ((s - s.mean(1, keepdim=True)) / (s.std(1, keepdim=True) + 1e-6)).flatten()


def step(policy, ref_policy, optimizer, input_ids, mask, scores, group_size=8, beta=0.04):
    n = mask.size(1)
    logps = token_logps(policy, input_ids, n)
    with torch.no_grad():
        ref_logps = token_logps(ref_policy, input_ids, n)
        # error: KL003
        kl_reward = -beta * (logps - ref_logps)
        advantages = group_advantages(scores, group_size)[:, None] + kl_reward
    loss = -((advantages * logps * mask).sum(-1) / mask.sum(-1)).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
