# Reviewer: prime-rl-style loss whose KL penalty object is built from a Hydra-style node,
# {"_target_": "<module>.SequenceMSEKL", "coef": 0.02}, by a small stand-in for
# hydra.utils.instantiate (workers run without Hydra). The estimator itself is right:
# k2 of the SEQUENCE log-ratio. But its __call__ is decorated with @torch.no_grad()
# ("it is also logged every step"), so the returned penalty carries no gradient; it is
# added to the loss as a penalty and contributes exactly zero gradient.
# Verdict: bug, KL005, reported on the `kl_penalty = self.kl(...)` call in compute_loss
# (the helper returns the estimate; the loss calls it).
import importlib
from dataclasses import dataclass, field
from typing import Any

import torch

from prime_rl.trainer.config import LossConfig
from prime_rl.trainer.model import get_model


def instantiate(node: dict[str, Any]):
    """Minimal hydra.utils.instantiate: resolve `_target_`, pass the other keys."""
    kwargs = {k: v for k, v in node.items() if not k.startswith("_")}
    module_name, _, attr = node["_target_"].rpartition(".")
    target = getattr(importlib.import_module(module_name), attr)
    return target(**kwargs)


class SequenceMSEKL:
    def __init__(self, coef: float = 0.02):
        self.coef = coef

    @torch.no_grad()
    def __call__(self, logprobs, ref_logprobs, loss_mask):
        seq_log_ratio = ((logprobs - ref_logprobs) * loss_mask).sum(-1)
        return self.coef * 0.5 * seq_log_ratio.pow(2)


@dataclass
class TrainerLossConfig:
    clip_low: float = 0.2
    clip_high: float = 0.28
    kl: dict = field(default_factory=lambda: {"_target_": f"{__name__}.SequenceMSEKL", "coef": 0.02})


class RLLoss:
    def __init__(self, cfg: TrainerLossConfig = TrainerLossConfig()):
        self.cfg = cfg
        self.kl = instantiate(cfg.kl)

    def compute_loss(self, logprobs, old_logprobs, ref_logprobs, advantages, loss_mask):
        ratio = torch.exp(logprobs - old_logprobs)
        clipped = ratio.clamp(1 - self.cfg.clip_low, 1 + self.cfg.clip_high)
        pg = -torch.minimum(ratio * advantages, clipped * advantages)
        pg_loss = (pg * loss_mask).sum(-1).mean()
        # error: KL005
        kl_penalty = self.kl(logprobs, ref_logprobs, loss_mask)
        loss = pg_loss + kl_penalty.mean()
        return loss, {"pg_loss": pg_loss.item(), "kl_penalty": kl_penalty.mean().item()}


def train_micro_step(model, batch, loss_fn: RLLoss):
    logits = model(input_ids=batch["input_ids"]).logits[:, :-1].float()
    logprobs = torch.gather(logits.log_softmax(-1), -1, batch["input_ids"][:, 1:, None]).squeeze(-1)
    logprobs = logprobs[:, -batch["loss_mask"].size(1):]
    loss, metrics = loss_fn.compute_loss(
        logprobs, batch["old_logprobs"], batch["ref_logprobs"], batch["advantages"], batch["loss_mask"]
    )
    loss.backward()
    return metrics
