"""RLOO: detached k1 summed per sequence in a list comprehension and subtracted from the score; leave-one-out baseline."""
import torch


def response_logprobs(model, prompt_ids, response_ids):
    input_ids = torch.cat([prompt_ids, response_ids]).unsqueeze(0)
    logits = model(input_ids).logits[0, prompt_ids.numel() - 1 : -1]
    return torch.log_softmax(logits, -1).gather(-1, response_ids.unsqueeze(-1)).squeeze(-1)


def rloo_loss(policy, ref_policy, prompts, responses, scores, rloo_k=4, beta=0.05):
    logps = [response_logprobs(policy, p, r) for p, r in zip(prompts, responses)]
    with torch.no_grad():
        ref_logps = [response_logprobs(ref_policy, p, r) for p, r in zip(prompts, responses)]
        # ok: KL001,KL003,KL005
        seq_kl = torch.stack([(lp - ref_lp).sum() for lp, ref_lp in zip(logps, ref_logps)])
        rewards = scores - beta * seq_kl
        grouped = rewards.view(-1, rloo_k)
        baseline = (grouped.sum(dim=1, keepdim=True) - grouped) / (rloo_k - 1)
        advantages = (grouped - baseline).flatten()
    seq_logps = torch.stack([lp.sum() for lp in logps])
    return -(advantages * seq_logps).mean()


def train_step(policy, ref_policy, optimizer, batch):
    loss = rloo_loss(policy, ref_policy, batch["prompts"], batch["responses"], batch["scores"])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()
