"""GRPO variant with an importance-weighted k3 KL term, averaged over tokens."""
import torch
import torch.nn.functional as F


def selective_log_softmax(logits, index):
    return torch.gather(F.log_softmax(logits, dim=-1), -1, index.unsqueeze(-1)).squeeze(-1)


def grpo_loss(model, ref_model, batch, beta=0.04, eps=0.2):
    ids = batch["prompt_completion_ids"]
    c = batch["completion_mask"].size(1)
    lp = selective_log_softmax(model(ids).logits[:, -c - 1 : -1], ids[:, -c:])
    with torch.no_grad():
        lq = selective_log_softmax(ref_model(ids).logits[:, -c - 1 : -1], ids[:, -c:])
    m = batch["completion_mask"]
    coef_1 = torch.exp(lp - batch["old_per_token_logps"])
    coef_2 = coef_1.clamp(1 - eps, 1 + eps)
    adv = batch["advantages"].unsqueeze(1)
    per_token_loss = -torch.min(coef_1 * adv, coef_2 * adv)
    # error: KL003
    per_token_kl = torch.exp(lp - lp.detach()) * (torch.exp(lq - lp) - (lq - lp) - 1)
    per_token_loss = per_token_loss + beta * per_token_kl
    return ((per_token_loss * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean()


def train_step(model, ref_model, optimizer, batch):
    loss = grpo_loss(model, ref_model, batch)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
