"""GRPO step that logs a detached k3 metric (.item()) while the loss carries a reward-to-go KL score-function term."""
import torch


def masked_sum(x, mask, dim=-1):
    return torch.where(mask.bool(), x, torch.zeros_like(x)).sum(dim)


def token_logps(model, input_ids, labels):
    logits = model(input_ids).logits[:, :-1]
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def training_step(model, ref_model, optimizer, batch, beta=0.04, metrics=None):
    metrics = {} if metrics is None else metrics
    mask = batch["completion_mask"]
    logp = token_logps(model, batch["input_ids"], batch["labels"])
    with torch.no_grad():
        ref_logp = token_logps(ref_model, batch["input_ids"], batch["labels"])
        log_ratio = torch.where(mask.bool(), logp - ref_logp, torch.zeros_like(logp))
        kl_to_go = log_ratio.flip(-1).cumsum(-1).flip(-1)
        # ok: KL002,KL005
        k3 = torch.exp(-log_ratio) + log_ratio - 1
    metrics["kl"] = masked_sum(k3, mask).mean().item()

    ratio = torch.exp(logp - logp.detach())
    pg_loss = -masked_sum(ratio * batch["advantages"].unsqueeze(1), mask).mean()
    kl_loss = masked_sum(kl_to_go * logp, mask).mean()
    loss = pg_loss + beta * kl_loss

    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    metrics["loss"] = loss.item()
    return metrics
