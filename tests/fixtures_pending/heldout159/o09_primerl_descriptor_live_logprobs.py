# Reviewer: same prime-rl-style trainer as e09, with the `TensorField`
# descriptor that stores detached copies of the engine's tensors. Here
# MicroBatch declares `logprobs = TensorField(detach=False)`, so
# `mb.logprobs = logprobs` keeps the autograd graph, and the sequence k2 term
# 0.5 * (sum_t mask_t logr_t)^2 built from `mb.logprobs` has gradient
# grad KL(pi||pi_ref) of the sequence (times kl_tau, batch mean). The reference
# log-probs are detached, as they should be.
# Verdict: correct. The KL line reads descriptor-managed attributes, but the
# policy side keeps its gradient.
from dataclasses import dataclass

import torch

from prime_rl.trainer.rl.config import LossConfig
from prime_rl.trainer.world import get_world


class TensorField:
    """Descriptor for micro-batch tensors; engine outputs are stored detached."""

    def __init__(self, detach: bool = True):
        self.detach = detach

    def __set_name__(self, owner, name):
        self.slot = "_" + name

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return obj.__dict__[self.slot]

    def __set__(self, obj, value: torch.Tensor):
        obj.__dict__[self.slot] = value.detach() if self.detach else value


class MicroBatch:
    inference_logprobs = TensorField()
    ref_logprobs = TensorField()
    logprobs = TensorField(detach=False)
    advantages = TensorField()
    loss_mask = TensorField()

    def __init__(self, inference_logprobs, ref_logprobs, advantages, loss_mask):
        self.inference_logprobs = inference_logprobs
        self.ref_logprobs = ref_logprobs
        self.advantages = advantages
        self.loss_mask = loss_mask


@dataclass
class RLLossConfig:
    mask_ratio_high: float = 8.0
    kl_tau: float = 0.02
    max_norm: float = 1.0


def compute_loss(logprobs: torch.Tensor, mb: MicroBatch, cfg: RLLossConfig):
    mb.logprobs = logprobs
    mask = mb.loss_mask
    log_importance_ratio = logprobs - mb.inference_logprobs
    importance_ratio = torch.exp(log_importance_ratio)
    is_masked = (importance_ratio.detach() > cfg.mask_ratio_high).float()
    keep = mask * (1.0 - is_masked)
    pg_loss = -(importance_ratio * mb.advantages[:, None] * keep).sum(-1).mean()

    # ok: KL005
    kl = 0.5 * ((mb.logprobs - mb.ref_logprobs) * mask).sum(-1).pow(2)
    loss = pg_loss + cfg.kl_tau * kl.mean()
    stats = {
        "kl": kl.detach().mean(),
        "masked_frac": (is_masked * mask).sum() / mask.sum(),
    }
    return loss, stats


def train_micro_step(model, batch: dict, cfg: RLLossConfig = RLLossConfig()):
    mb = MicroBatch(batch["inference_logprobs"], batch["ref_logprobs"], batch["advantages"], batch["loss_mask"])
    logits = model(input_ids=batch["input_ids"]).logits[:, :-1]
    logprobs = torch.gather(logits.log_softmax(-1), -1, batch["input_ids"][:, 1:, None]).squeeze(-1)
    loss, stats = compute_loss(logprobs, mb, cfg)
    loss.backward()
    return {k: float(v) for k, v in stats.items()}
