"""Losses that guard against empty masks with ``torch.where``.

Truncated or filtered responses can leave a row (or a whole micro-batch) with no valid
token; dividing by its token count would give NaN. The guards below select a value or
zero; the selected branch keeps its gradient, so the KL term inside still reaches the
loss with whatever gradient its estimator has.

- ``torch.where(denom > 0, per_seq_k3 / denom, 0)``: k3 per token: KL002;
- ``torch.where(mask, k3, 0.0)``: KL002; ``torch.where(mask, logp - ref, 0.0)``: KL001;
- the same guards around the reward-to-go score function: quiet.

Fixture: parsed by the tests, never executed.
"""

from __future__ import annotations

import torch


def seq_guarded_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over each row's valid tokens; rows without any contribute zero."""
    denom = mask.sum(-1)
    per_row = (values * mask).sum(-1)
    return torch.where(denom > 0, per_row / denom.clamp(min=1), 0)


def policy_logps(model, batch):
    logits = model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logits = logits[:, -batch["response_ids"].shape[1] - 1 : -1]
    return logits.float().log_softmax(-1).gather(-1, batch["response_ids"].unsqueeze(-1)).squeeze(-1)


def guarded_k3_loss(model, batch, beta: float = 0.02):
    mask = batch["response_mask"].float()
    logp = policy_logps(model, batch)
    ref_logp = batch["ref_logps"]
    pg = -seq_guarded_mean(batch["advantages"].unsqueeze(-1) * torch.exp(logp - logp.detach()), mask)
    # error: KL002
    k3 = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
    denom = mask.sum(-1)
    kl = torch.where(denom > 0, (k3 * mask).sum(-1) / denom.clamp(min=1), 0)
    return (pg + beta * kl).mean()


def where_masked_k3_loss(model, batch, beta: float = 0.02):
    valid = batch["response_mask"].bool()
    logp = policy_logps(model, batch)
    ref_logp = batch["ref_logps"]
    pg = -torch.where(valid, batch["advantages"].unsqueeze(-1) * torch.exp(logp - logp.detach()), 0.0)
    # error: KL002
    kl = torch.where(valid, torch.exp(ref_logp - logp) - (ref_logp - logp) - 1, 0.0)
    n_valid = valid.sum()
    total = torch.where(n_valid > 0, (pg + beta * kl).sum() / n_valid.clamp(min=1), 0.0)
    return total


def where_masked_k1_loss(model, batch, beta: float = 0.02):
    valid = batch["response_mask"].bool()
    logp = policy_logps(model, batch)
    pg = -(batch["advantages"] * torch.where(valid, logp, 0.0).sum(-1)).mean()
    # error: KL001
    log_ratio = torch.where(valid, logp - batch["ref_logps"], 0.0)
    return pg + beta * log_ratio.sum(-1).mean()


def guarded_kl_to_go_loss(model, batch, beta: float = 0.02):
    valid = batch["response_mask"].bool()
    logp = policy_logps(model, batch)
    pg = -(batch["advantages"] * torch.where(valid, logp, 0.0).sum(-1)).mean()
    # ok: KL001, KL002, KL003, KL004, KL005, KL006
    log_ratio = torch.where(valid, logp - batch["ref_logps"], 0.0).detach()
    kl_to_go = log_ratio.flip(-1).cumsum(-1).flip(-1)
    # ok: KL001, KL002, KL003, KL004, KL005, KL006
    kl = torch.where(valid, kl_to_go * logp, 0.0).sum(-1)
    return pg + beta * kl.mean()


def training_step(model, optimizer, batch, variant: str = "k3"):
    if variant == "k3":
        loss = guarded_k3_loss(model, batch)
    elif variant == "where_k3":
        loss = where_masked_k3_loss(model, batch)
    elif variant == "k1":
        loss = where_masked_k1_loss(model, batch)
    else:
        loss = guarded_kl_to_go_loss(model, batch)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()
