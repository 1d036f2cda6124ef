# Reviewer: an unsloth-style GRPO loss for a LoRA model, where the reference
# is the same network with its adapter disabled. A refactor moved the
# adapter-disabled pass around and left the names behind: `policy_logps` is
# now computed under torch.no_grad() inside `model.disable_adapter()` (it is
# the reference), and `ref_logps` is the adapter-enabled forward with gradient
# (it is the policy; the PPO ratio uses it too). Read by value, the KL line is
# exp(ref - logp) - (ref - logp) - 1: the k3 estimate, differentiated through
# the policy. Its expected gradient is the token-level gradient of
# KL(pi_ref||pi), not of KL(pi||pi_ref) (KL002), reported on the k3 line.
import torch
from unsloth import FastLanguageModel  # noqa: F401  (model comes in patched)


def _selective_logps(model, input_ids, attention_mask, logits_to_keep, temperature=1.0):
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    logits = logits[:, -logits_to_keep - 1 : -1, :].float() / temperature
    target = input_ids[:, -logits_to_keep:]
    logps = torch.gather(logits.log_softmax(-1), -1, target.unsqueeze(-1))
    return logps.squeeze(-1)


def grpo_lora_loss(model, batch, cfg):
    """One micro-batch of GRPO on a PEFT model; returns (loss, metrics)."""
    input_ids = batch["input_ids"]
    attention_mask = batch["attention_mask"]
    completion_mask = batch["completion_mask"].float()
    logits_to_keep = completion_mask.size(1)

    # base weights, adapter switched off (the KL anchor)
    with torch.no_grad(), model.disable_adapter():
        policy_logps = _selective_logps(model, input_ids, attention_mask, logits_to_keep, cfg.temperature)

    ref_logps = _selective_logps(model, input_ids, attention_mask, logits_to_keep, cfg.temperature)

    old_logps = batch.get("old_logps")
    if old_logps is None:
        old_logps = ref_logps.detach()
    adv = batch["advantages"].unsqueeze(-1)
    ratio = torch.exp(ref_logps - old_logps)
    clipped = torch.clamp(ratio, 1.0 - cfg.epsilon, 1.0 + cfg.epsilon)
    pg_loss = -torch.min(ratio * adv, clipped * adv)

    # error: KL002
    kl_i = torch.exp(policy_logps - ref_logps) - (policy_logps - ref_logps) - 1.0
    per_token = pg_loss + cfg.beta * kl_i

    loss = (per_token * completion_mask).sum(-1).mean()
    with torch.no_grad():
        n_tok = completion_mask.sum().clamp(min=1.0)
        metrics = {
            "kl": ((kl_i * completion_mask).sum() / n_tok).item(),
            "clip_frac": (((ratio - 1).abs() > cfg.epsilon).float() * completion_mask).sum().item() / n_tok.item(),
            "completion_length": completion_mask.sum(-1).mean().item(),
        }
    return loss, metrics
