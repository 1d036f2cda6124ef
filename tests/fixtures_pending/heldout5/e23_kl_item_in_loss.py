"""SkyRL/AReaL-like: KL reduced to a Python float before it is added to the loss."""
import torch


def per_token_logps(model, input_ids, logits_to_keep):
    logits = model(input_ids).logits[:, -logits_to_keep - 1 : -1]
    return torch.gather(logits.log_softmax(-1), 2, input_ids[:, -logits_to_keep:].unsqueeze(-1)).squeeze(-1)


def masked_mean(x, mask):
    return (x * mask).sum() / mask.sum()


def ppo_loss(model, ref_model, batch, kl_coef=0.02, eps=0.2):
    k = batch["loss_mask"].size(1)
    logprobs = per_token_logps(model, batch["input_ids"], k)
    with torch.no_grad():
        ref_logprobs = per_token_logps(ref_model, batch["input_ids"], k)
    mask = batch["loss_mask"]
    ratio = torch.exp(logprobs - batch["old_logprobs"])
    adv = batch["advantages"]
    pg_loss = masked_mean(-torch.min(ratio * adv, ratio.clamp(1 - eps, 1 + eps) * adv), mask)
    log_ratio = ref_logprobs - logprobs
    # error: KL005
    kl_value = masked_mean(log_ratio.exp() - 1 - log_ratio, mask).item()
    return pg_loss + kl_coef * kl_value, {"kl": kl_value}


def train_step(model, ref_model, optimizer, scaler, batch):
    loss, metrics = ppo_loss(model, ref_model, batch)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
    return metrics
