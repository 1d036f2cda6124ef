"""A KL regulariser packaged as an ``nn.Module`` and held by the trainer as an attribute.

``KLLoss`` has no default estimator: the owner picks one when it builds the module, so
the verdict belongs where the module is built and called (``self.kl_loss_fn(...)`` in
the trainer's loss), once, not inside ``forward`` as well.

- ``KLLoss(kind="low_var_kl")``: k3 per token, averaged: KL002;
- ``KLLoss(kind="seq_k2")``: 0.5 * (sum_t logr_t)**2 per response, whose gradient
  ``sum_t grad logp_t * sum_s logr_s`` has expectation grad KL(pi||pi_ref): quiet.

Fixture: parsed by the tests, never executed.
"""

from __future__ import annotations

import torch
from torch import nn


class KLLoss(nn.Module):
    def __init__(self, kind: str, clamp: float = 20.0):
        super().__init__()
        if kind not in ("low_var_kl", "k1", "mse", "seq_k2"):
            raise ValueError(f"unknown KL kind {kind!r}")
        self.kind = kind
        self.clamp = clamp

    def forward(self, logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        log_ratio = logp - ref_logp
        if self.kind == "seq_k2":
            # ok: KL001, KL002, KL003
            seq_log_ratio = (log_ratio * mask).sum(-1)
            return (0.5 * seq_log_ratio**2).mean()
        if self.kind == "k1":
            # ok: KL001, KL002, KL003
            per_token = log_ratio
        elif self.kind == "mse":
            # ok: KL001, KL002, KL003
            per_token = 0.5 * log_ratio**2
        else:
            neg = torch.clamp(-log_ratio, -self.clamp, self.clamp)
            # ok: KL001, KL002, KL003
            per_token = torch.exp(neg) - neg - 1
        return (per_token * mask).sum() / mask.sum().clamp(min=1)


class GRPOLearner:
    def __init__(self, policy, ref_policy, optimizer, beta: float = 0.04):
        self.policy = policy
        self.ref_policy = ref_policy
        self.optimizer = optimizer
        self.beta = beta
        self.kl_loss_fn = KLLoss(kind="low_var_kl")

    def token_logps(self, model, input_ids, attention_mask, completion_ids):
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        logits = logits[:, -completion_ids.size(1) - 1 : -1].float()
        return torch.gather(logits.log_softmax(-1), -1, completion_ids.unsqueeze(-1)).squeeze(-1)

    def compute_loss(self, batch):
        mask = batch["completion_mask"]
        logp = self.token_logps(self.policy, batch["input_ids"], batch["attention_mask"], batch["completion_ids"])
        with torch.no_grad():
            ref_logp = self.token_logps(self.ref_policy, batch["input_ids"], batch["attention_mask"], batch["completion_ids"])
        ratio = torch.exp(logp - logp.detach())
        pg_loss = -((ratio * batch["advantages"].unsqueeze(1)) * mask).sum() / mask.sum()
        # error: KL002
        kl = self.kl_loss_fn(logp, ref_logp, mask)
        return pg_loss + self.beta * kl

    def step(self, batch):
        loss = self.compute_loss(batch)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.item()


class SequenceKLLearner(GRPOLearner):
    def __init__(self, policy, ref_policy, optimizer, beta: float = 0.04):
        super().__init__(policy, ref_policy, optimizer, beta)
        self.kl_loss_fn = KLLoss(kind="seq_k2")

    def compute_loss(self, batch):
        mask = batch["completion_mask"]
        logp = self.token_logps(self.policy, batch["input_ids"], batch["attention_mask"], batch["completion_ids"])
        with torch.no_grad():
            ref_logp = self.token_logps(self.ref_policy, batch["input_ids"], batch["attention_mask"], batch["completion_ids"])
        pg_loss = -(batch["advantages"] * (logp * mask).sum(-1)).mean()
        # ok: KL001, KL002, KL003, KL004, KL005, KL006
        kl = self.kl_loss_fn(logp, ref_logp, mask)
        return pg_loss + self.beta * kl
