"""GRPO loss that picks its per-token KL estimator from a dict of callables keyed by a nested dict config."""
import torch


def _k1(logp, ref_logp):
    return logp - ref_logp


def _k2(logp, ref_logp):
    return 0.5 * (logp - ref_logp) ** 2


def _k3(logp, ref_logp):
    log_ratio = (ref_logp - logp).clamp(-20.0, 20.0)
    return log_ratio.exp() - log_ratio - 1.0


ESTIMATORS = {"k1": _k1, "k2": _k2, "k3": _k3, "low_var_kl": _k3}

CONFIG = {
    "actor": {"clip_ratio": 0.2, "lr": 1e-6},
    "kl": {"estimator": "low_var_kl", "coef": 0.04},
}


def masked_mean(x, mask, dim=None):
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def grpo_loss(logp, old_logp, ref_logp, advantages, mask, config=CONFIG):
    eps = config["actor"]["clip_ratio"]
    ratio = torch.exp(logp - old_logp)
    adv = advantages.unsqueeze(-1)
    pg = -torch.min(ratio * adv, ratio.clamp(1 - eps, 1 + eps) * adv)
    estimator = ESTIMATORS[config["kl"]["estimator"]]
    # error: KL002
    per_token_kl = estimator(logp, ref_logp)
    per_token_loss = pg + config["kl"]["coef"] * per_token_kl
    return masked_mean(per_token_loss, mask, dim=-1).mean()


def token_logps(model, input_ids, labels):
    logits = model(input_ids).logits[:, :-1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def train_step(policy, ref_policy, batch, optimizer):
    logp = token_logps(policy, batch["input_ids"], batch["labels"])
    with torch.no_grad():
        ref_logp = token_logps(ref_policy, batch["input_ids"], batch["labels"])
    loss = grpo_loss(logp, batch["old_logp"], ref_logp, batch["advantages"], batch["mask"])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.detach()
