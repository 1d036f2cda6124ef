"""RLOO-style trainer: KL folded into the sequence reward, but with the wrong sign."""
import torch


def completion_logprobs(model, input_ids, completion_ids):
    logits = model(input_ids).logits[:, -completion_ids.shape[1] - 1 : -1]
    return torch.gather(logits.log_softmax(-1), 2, completion_ids.unsqueeze(-1)).squeeze(-1)


def rloo_step(policy, ref_policy, optimizer, input_ids, completion_ids, mask, scores, k=4, kl_coef=0.05):
    logprobs = completion_logprobs(policy, input_ids, completion_ids)
    with torch.no_grad():
        ref_logprobs = completion_logprobs(ref_policy, input_ids, completion_ids)
        seq_kl = ((logprobs - ref_logprobs) * mask).sum(1)
        # error: KL006
        rewards = scores + kl_coef * seq_kl
        rewards = rewards.view(k, -1)
        baseline = (rewards.sum(0, keepdim=True) - rewards) / (k - 1)
        advantages = (rewards - baseline).flatten()
    loss = -(advantages * (logprobs * mask).sum(1)).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item(), seq_kl.mean().item()
