# Reviewer: NeMo-RL-style ClippedPGLossFn whose KL regulariser is a frozen
# dataclass holding lambdas (`estimator`, `reduce`). With the default
# KLRegularizer (coef=0.01, estimator = per-token k3 summed per sequence) the
# loss calls the estimator on `prev_logprobs`, the log-probs stored with the
# rollout (computed without gradient), instead of `curr_logprobs`. The KL term
# is a constant for autograd: it is logged and added to the loss, but its
# gradient is exactly zero, so nothing regularises the policy.
# Verdict: bug, KL005, reported on the line of __call__ that calls the
# estimator lambda.
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, TypedDict

import torch
from torch import Tensor

from nemo_rl.algorithms.interfaces import LossFunction, LossType
from nemo_rl.distributed.batched_data_dict import BatchedDataDict

Estimator = Callable[[Tensor, Tensor, Tensor], Tensor]
Reducer = Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class KLRegularizer:
    coef: float = 0.01
    estimator: Estimator = lambda lp, ref, m: ((ref - lp).exp() - (ref - lp) - 1).mul(m).sum(-1)
    reduce: Reducer = lambda per_seq: per_seq.mean()


@dataclass(frozen=True)
class ClippedPGLossConfig:
    ratio_clip_min: float = 0.2
    ratio_clip_max: float = 0.2
    kl: KLRegularizer = field(default_factory=KLRegularizer)
    token_level_loss: bool = False


class ClippedPGLossDataDict(TypedDict):
    input_ids: Tensor
    advantages: Tensor
    prev_logprobs: Tensor
    generation_logprobs: Tensor
    reference_policy_logprobs: Tensor
    token_mask: Tensor
    sample_mask: Tensor


class ClippedPGLossFn(LossFunction):
    loss_type = LossType.SEQUENCE_LEVEL

    def __init__(self, cfg: ClippedPGLossConfig = ClippedPGLossConfig()):
        self.cfg = cfg
        self.kl = cfg.kl

    def __call__(
        self,
        curr_logprobs: Tensor,
        data: BatchedDataDict[ClippedPGLossDataDict],
    ) -> tuple[Tensor, dict[str, float]]:
        mask = data["token_mask"][:, 1:] * data["sample_mask"].unsqueeze(-1)
        advantages = data["advantages"][:, 1:]
        prev_logprobs = data["prev_logprobs"][:, 1:]
        ref_logprobs = data["reference_policy_logprobs"][:, 1:]

        ratios = (curr_logprobs - prev_logprobs).exp()
        ratios_clamped = ratios.clamp(1.0 - self.cfg.ratio_clip_min, 1.0 + self.cfg.ratio_clip_max)
        per_token_pg = torch.max(-advantages * ratios, -advantages * ratios_clamped)
        if self.cfg.token_level_loss:
            pg_loss = (per_token_pg * mask).sum() / mask.sum().clamp_min(1.0)
        else:
            pg_loss = (per_token_pg * mask).sum(-1).mean()

        loss = pg_loss
        metrics = {"actor_loss": pg_loss.item()}
        if self.kl.coef > 0:
            # error: KL005
            kl_per_seq = self.kl.estimator(prev_logprobs, ref_logprobs, mask)
            kl_penalty = self.kl.reduce(kl_per_seq)
            loss = loss + self.kl.coef * kl_penalty
            metrics["kl_penalty"] = kl_penalty.item()
        metrics["loss"] = loss.item()
        return loss, metrics


def get_logprobs(logits: Tensor, input_ids: Tensor) -> Tensor:
    logprobs = logits[:, :-1].log_softmax(-1)
    return logprobs.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def train_micro_batches(policy, optimizer, batches, loss_fn: ClippedPGLossFn | None = None) -> list[dict[str, float]]:
    loss_fn = loss_fn or ClippedPGLossFn()
    history = []
    for mb in batches:
        logits = policy(mb["input_ids"]).logits
        curr_logprobs = get_logprobs(logits, mb["input_ids"])
        loss, metrics = loss_fn(curr_logprobs, mb)
        loss.backward()
        history.append(metrics)
    optimizer.step()
    optimizer.zero_grad()
    return history
