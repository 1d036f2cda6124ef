"""Per-sample zip loop: each token's advantage is the terminal score minus that token's detached log-ratio."""
import torch


def response_logprobs(model, prompt_ids, response_ids):
    input_ids = torch.cat([prompt_ids, response_ids]).unsqueeze(0)
    logits = model(input_ids).logits[0, prompt_ids.numel() - 1 : -1]
    return torch.log_softmax(logits, -1).gather(-1, response_ids.unsqueeze(-1)).squeeze(-1)


def reinforce_loss(policy, ref_policy, prompts, responses, scores, beta=0.05):
    logps = [response_logprobs(policy, p, r) for p, r in zip(prompts, responses)]
    with torch.no_grad():
        ref_logps = [response_logprobs(ref_policy, p, r) for p, r in zip(prompts, responses)]
    losses = []
    for score, lp, ref_lp in zip(scores, logps, ref_logps):
        # error: KL003
        token_adv = score - beta * (lp.detach() - ref_lp)
        losses.append(-(token_adv * lp).sum())
    return torch.stack(losses).mean()


def train_step(policy, ref_policy, optimizer, batch):
    loss = reinforce_loss(policy, ref_policy, batch["prompts"], batch["responses"], batch["scores"])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()
