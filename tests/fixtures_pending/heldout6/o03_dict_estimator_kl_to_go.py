"""GRPO loss: k3 value from a dict of callables is logged, the gradient comes from a reward-to-go surrogate."""
import torch


def _k1(logp, ref_logp):
    return logp - ref_logp


def _k3(logp, ref_logp):
    log_ratio = (ref_logp - logp).clamp(-20.0, 20.0)
    return log_ratio.exp() - log_ratio - 1.0


ESTIMATORS = {"k1": _k1, "k3": _k3, "low_var_kl": _k3}
CONFIG = {"actor": {"clip_ratio": 0.2}, "kl": {"estimator": "low_var_kl", "coef": 0.04}}


def reverse_cumsum(x, dim=-1):
    return x.flip(dim).cumsum(dim).flip(dim)


def grpo_loss(logp, old_logp, ref_logp, advantages, mask, config=CONFIG):
    eps = config["actor"]["clip_ratio"]
    ratio = torch.exp(logp - old_logp)
    adv = advantages.unsqueeze(-1)
    pg = -torch.min(ratio * adv, ratio.clamp(1 - eps, 1 + eps) * adv)
    kl_value = ESTIMATORS[config["kl"]["estimator"]](logp, ref_logp).detach()
    kl_to_go = reverse_cumsum((logp - ref_logp).detach() * mask)
    # ok: KL001,KL002,KL003
    per_token_kl = kl_value + kl_to_go * (logp - logp.detach())
    per_token_loss = pg + config["kl"]["coef"] * per_token_kl
    loss = (per_token_loss * mask).sum(-1).mean()
    return loss, (kl_value * mask).sum(-1).mean()


def train_step(policy, ref_policy, batch, optimizer):
    logits = policy(batch["input_ids"]).logits[:, :-1].float()
    logp = torch.log_softmax(logits, dim=-1).gather(-1, batch["labels"].unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        ref_logits = ref_policy(batch["input_ids"]).logits[:, :-1].float()
        ref_logp = torch.log_softmax(ref_logits, dim=-1).gather(-1, batch["labels"].unsqueeze(-1)).squeeze(-1)
    loss, kl = grpo_loss(logp, batch["old_logp"], ref_logp, batch["advantages"], batch["mask"])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return {"loss": loss.item(), "kl": kl.item()}
