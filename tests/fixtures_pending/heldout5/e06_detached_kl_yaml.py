"""Actor update driven by a YAML-like config dict; KL from the behaviour log-probs."""
import torch

CONFIG = {
    "actor": {
        "clip_ratio": 0.2,
        "use_kl_loss": True,
        "kl_loss_coef": 0.01,
        "kl_loss_type": "mse",
    },
    "rollout": {"n": 8, "temperature": 1.0},
}


def logprobs_from_logits(logits, labels):
    return torch.log_softmax(logits, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def update_actor(actor, ref, optimizer, data, cfg=CONFIG):
    acfg = cfg["actor"]
    n = data["responses"].shape[-1]
    logits = actor(data["input_ids"]).logits[:, -n - 1 : -1]
    log_prob = logprobs_from_logits(logits, data["responses"])
    old_log_prob = data["old_log_probs"]
    with torch.no_grad():
        ref_log_prob = logprobs_from_logits(ref(data["input_ids"]).logits[:, -n - 1 : -1], data["responses"])
    mask = data["response_mask"]
    ratio = torch.exp(log_prob - old_log_prob)
    adv = data["advantages"]
    clipped = ratio.clamp(1 - acfg["clip_ratio"], 1 + acfg["clip_ratio"])
    pg_loss = (-torch.min(ratio * adv, clipped * adv) * mask).sum() / mask.sum()
    loss = pg_loss
    if acfg["use_kl_loss"]:
        # error: KL005
        kl = 0.5 * (old_log_prob - ref_log_prob).square()
        kl_loss = (kl * mask).sum() / mask.sum()
        loss = loss + acfg["kl_loss_coef"] * kl_loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return {"actor/pg_loss": pg_loss.item(), "actor/kl_loss": float(kl_loss) if acfg["use_kl_loss"] else 0.0}
