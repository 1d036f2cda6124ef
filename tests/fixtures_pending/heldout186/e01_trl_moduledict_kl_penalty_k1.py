# Reviewer: TRL-style GRPO trainer whose loss is an nn.ModuleDict of loss modules,
# summed with `sum(loss(batch) for loss in self.losses.values())`. The KLPenalty
# module is configured in __init__ from GRPOLossConfig (default estimator "k1",
# reduction "token_sum") and reads the log-probs out of the batch itself. With
# the default config it differentiates -(ref - logp) = logp - ref per token and
# sums it over tokens: its expected gradient is zero, no regularisation at all.
# Verdict: bug, KL001, reported inside KLPenalty.forward (given only a batch, called
# from one place) on the line that computes the k1 estimate.
from dataclasses import dataclass

import torch
import torch.nn as nn

from transformers import Trainer
from trl.trainer.utils import selective_log_softmax


@dataclass
class GRPOLossConfig:
    beta: float = 0.04
    epsilon: float = 0.2
    kl_estimator: str = "k1"
    kl_reduction: str = "token_sum"
    max_completion_length: int = 256


class ClippedSurrogateLoss(nn.Module):
    def __init__(self, epsilon: float = 0.2):
        super().__init__()
        self.epsilon = epsilon

    def forward(self, batch):
        logps = batch["per_token_logps"]
        ratio = torch.exp(logps - batch["old_per_token_logps"])
        adv = batch["advantages"].unsqueeze(1)
        clipped = torch.clamp(ratio, 1 - self.epsilon, 1 + self.epsilon)
        per_token_loss = -torch.min(ratio * adv, clipped * adv)
        return (per_token_loss * batch["completion_mask"]).sum(-1).mean()


class KLPenalty(nn.Module):
    def __init__(self, beta: float, estimator: str = "k1", reduction: str = "token_sum"):
        super().__init__()
        self.beta = beta
        self.estimator = estimator
        self.reduction = reduction

    def _reduce(self, per_token, mask):
        if self.reduction == "token_sum":
            return (per_token * mask).sum(-1).mean()
        if self.reduction == "token_mean":
            return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
        raise ValueError(f"unknown reduction {self.reduction}")

    def forward(self, batch):
        logps = batch["per_token_logps"]
        ref_logps = batch["ref_per_token_logps"]
        if self.estimator == "k1":
            # error: KL001
            per_token_kl = -(ref_logps - logps)
        elif self.estimator == "k3":
            # ok: KL002
            per_token_kl = torch.exp(ref_logps - logps) - (ref_logps - logps) - 1
        else:
            raise ValueError(f"unknown estimator {self.estimator}")
        return self.beta * self._reduce(per_token_kl, batch["completion_mask"])


class GRPOLossStack(nn.Module):
    def __init__(self, cfg: GRPOLossConfig):
        super().__init__()
        self.losses = nn.ModuleDict({"policy": ClippedSurrogateLoss(cfg.epsilon)})
        if cfg.beta != 0.0:
            self.losses["kl"] = KLPenalty(cfg.beta, cfg.kl_estimator, cfg.kl_reduction)

    def forward(self, batch):
        return sum(loss(batch) for loss in self.losses.values())


class ModularGRPOTrainer(Trainer):
    def __init__(self, *args, ref_model=None, loss_config: GRPOLossConfig = GRPOLossConfig(), **kwargs):
        super().__init__(*args, **kwargs)
        self.ref_model = ref_model
        self.loss_stack = GRPOLossStack(loss_config)

    def _logps(self, model, input_ids, attention_mask, logits_to_keep):
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -logits_to_keep - 1 : -1]
        return selective_log_softmax(logits, input_ids[:, -logits_to_keep:])

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attn = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        k = inputs["completion_ids"].size(1)
        batch = dict(inputs)
        batch["per_token_logps"] = self._logps(model, ids, attn, k)
        with torch.no_grad():
            batch["ref_per_token_logps"] = self._logps(self.ref_model, ids, attn, k)
        if "old_per_token_logps" not in batch:
            batch["old_per_token_logps"] = batch["per_token_logps"].detach()
        return self.loss_stack(batch)
