# Reviewer: TRL-style GRPO loss whose KL estimator is a `typing.Protocol`
# (`KLEstimator.__call__(logps, ref_logps, *, mask) -> Tensor`). The config
# default is `field(default_factory=LogRatioKL)`, which returns the per-token
# log-ratio k1, `logps - ref_logps`, WITH gradient. `grpo_loss` adds
# beta * k1 to the per-token loss, sums over tokens and averages over
# sequences (loss_type="sequence_sum", the default): the expected
# gradient of k1 is zero, so the KL term only adds noise (beta=0.04).
# Verdict: bug, KL001, reported on the line of grpo_loss that calls the
# estimator (a helper that returns the estimate).
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from accelerate import Accelerator
from trl import GRPOTrainer


@runtime_checkable
class KLEstimator(Protocol):
    name: str

    def __call__(self, logps: Tensor, ref_logps: Tensor, *, mask: Tensor) -> Tensor: ...


@dataclass(frozen=True)
class LogRatioKL:
    name: str = "k1"

    def __call__(self, logps: Tensor, ref_logps: Tensor, *, mask: Tensor) -> Tensor:
        return (logps - ref_logps) * mask


@dataclass(frozen=True)
class SquaredLogRatioKL:
    name: str = "k2"

    def __call__(self, logps: Tensor, ref_logps: Tensor, *, mask: Tensor) -> Tensor:
        return 0.5 * (logps - ref_logps).square() * mask


@dataclass
class GRPOLossConfig:
    beta: float = 0.04
    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    kl_estimator: KLEstimator = field(default_factory=LogRatioKL)
    loss_type: str = "sequence_sum"


def masked_token_mean(x: Tensor, mask: Tensor) -> Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def grpo_loss(
    per_token_logps: Tensor,
    old_per_token_logps: Tensor,
    ref_per_token_logps: Tensor,
    advantages: Tensor,
    completion_mask: Tensor,
    *,
    config: GRPOLossConfig,
) -> tuple[Tensor, dict[str, float]]:
    coef_1 = torch.exp(per_token_logps - old_per_token_logps)
    coef_2 = torch.clamp(coef_1, 1 - config.epsilon_low, 1 + config.epsilon_high)
    per_token_loss = -torch.min(coef_1 * advantages.unsqueeze(1), coef_2 * advantages.unsqueeze(1))
    metrics: dict[str, float] = {}
    if config.beta != 0.0:
        estimator: KLEstimator = config.kl_estimator
        assert isinstance(estimator, KLEstimator)
        # error: KL001
        per_token_kl = estimator(per_token_logps, ref_per_token_logps, mask=completion_mask)
        per_token_loss = per_token_loss + config.beta * per_token_kl
        metrics[f"kl/{estimator.name}"] = masked_token_mean(per_token_kl.detach(), completion_mask).item()
    if config.loss_type == "sequence_sum":
        loss = (per_token_loss * completion_mask).sum(-1).mean()
    else:
        loss = masked_token_mean(per_token_loss, completion_mask)
    metrics["loss"] = loss.item()
    return loss, metrics


def selective_log_softmax(logits: Tensor, index: Tensor) -> Tensor:
    return torch.gather(logits.log_softmax(-1), -1, index.unsqueeze(-1)).squeeze(-1)


class ProtocolGRPOTrainer(GRPOTrainer):
    def __init__(self, model, ref_model, optimizer, loss_config: GRPOLossConfig | None = None):
        self.model = model
        self.ref_model = ref_model
        self.optimizer = optimizer
        self.loss_config = loss_config or GRPOLossConfig()
        self.accelerator = Accelerator()

    def _get_per_token_logps(self, model, input_ids, attention_mask, logits_to_keep: int) -> Tensor:
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -logits_to_keep - 1 : -1]
        return selective_log_softmax(logits, input_ids[:, -logits_to_keep:])

    def compute_loss(self, model, inputs, return_outputs: bool = False, num_items_in_batch=None):
        logits_to_keep = inputs["completion_ids"].size(1)
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        per_token_logps = self._get_per_token_logps(model, input_ids, attention_mask, logits_to_keep)
        with torch.no_grad():
            ref_per_token_logps = self._get_per_token_logps(self.ref_model, input_ids, attention_mask, logits_to_keep)
        old = inputs.get("old_per_token_logps")
        old = per_token_logps.detach() if old is None else old
        loss, metrics = grpo_loss(
            per_token_logps,
            old,
            ref_per_token_logps,
            inputs["advantages"],
            inputs["completion_mask"],
            config=self.loss_config,
        )
        self.log_metrics = metrics
        return loss

    def training_step(self, inputs) -> float:
        self.model.train()
        loss = self.compute_loss(self.model, inputs)
        self.accelerator.backward(loss)
        self.optimizer.step()
        self.optimizer.zero_grad()
        return loss.detach().item()
