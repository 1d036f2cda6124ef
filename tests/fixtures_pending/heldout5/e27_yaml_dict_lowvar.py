"""verl-like actor loss; the KL type is read from a nested YAML-like dict."""
import torch

ALGO_CFG = {
    "algorithm": {"adv_estimator": "grpo", "use_kl_in_reward": False},
    "actor_rollout_ref": {"actor": {"use_kl_loss": True, "kl_loss_coef": 0.001, "kl_loss_type": "low_var_kl"}},
}


def kl_penalty(logprob, ref_logprob, kl_penalty="kl"):
    if kl_penalty == "kl":
        return logprob - ref_logprob
    if kl_penalty == "mse":
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty == "low_var_kl":
        kl = ref_logprob - logprob
        return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)
    raise NotImplementedError


def logprobs_from_logits(logits, labels):
    return logits.log_softmax(-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def update_policy(actor, ref, optimizer, data, cfg=ALGO_CFG):
    actor_cfg = cfg["actor_rollout_ref"]["actor"]
    n = data["responses"].size(-1)
    log_prob = logprobs_from_logits(actor(data["input_ids"]).logits[:, -n - 1 : -1], data["responses"])
    with torch.no_grad():
        ref_log_prob = logprobs_from_logits(ref(data["input_ids"]).logits[:, -n - 1 : -1], data["responses"])
    mask = data["response_mask"]
    ratio = torch.exp(log_prob - data["old_log_probs"])
    pg_loss = (-(ratio * data["advantages"]) * mask).sum() / mask.sum()
    policy_loss = pg_loss
    if actor_cfg["use_kl_loss"]:
        # error: KL002
        kld = kl_penalty(log_prob, ref_log_prob, kl_penalty=actor_cfg["kl_loss_type"])
        kl_loss = (kld * mask).sum() / mask.sum()
        policy_loss = policy_loss + kl_loss * actor_cfg["kl_loss_coef"]
    optimizer.zero_grad()
    policy_loss.backward()
    optimizer.step()
