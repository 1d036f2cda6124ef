# Reviewer: a user's own GRPO trainer. The KL penalty is dispatched on the type
# of the estimator object held in the config (functools.singledispatch): K1,
# K2Sequence and K3 are registered. GRPOConfig defaults to K1(), so the loss
# adds beta * (logp - ref_logp) with its gradient, summed over tokens. The k1
# term's expected gradient is exactly zero: no regularisation at all.
# Verdict: bug, KL001, reported on the line of the loss that calls kl_penalty().
from dataclasses import dataclass, field
from functools import singledispatch

import torch
import torch.nn.functional as F

from accelerate import Accelerator


@dataclass(frozen=True)
class K1:
    pass


@dataclass(frozen=True)
class K2Sequence:
    pass


@dataclass(frozen=True)
class K3:
    clamp: float = 10.0


@singledispatch
def kl_penalty(estimator, logps, ref_logps, mask):
    raise NotImplementedError(f"unknown KL estimator {type(estimator).__name__}")


@kl_penalty.register
def _(estimator: K1, logps, ref_logps, mask):
    return (logps - ref_logps) * mask


@kl_penalty.register
def _(estimator: K2Sequence, logps, ref_logps, mask):
    seq = ((logps - ref_logps) * mask).sum(-1, keepdim=True)
    return 0.5 * seq.square() * mask / mask.sum(-1, keepdim=True)


@kl_penalty.register
def _(estimator: K3, logps, ref_logps, mask):
    d = ref_logps - logps
    return torch.clamp(torch.exp(d) - d - 1, max=estimator.clamp) * mask


@dataclass
class GRPOConfig:
    beta: float = 0.04
    num_generations: int = 8
    epsilon: float = 0.2
    kl_estimator: object = field(default_factory=K1)


def selective_log_softmax(logits, index):
    return torch.gather(F.log_softmax(logits, dim=-1), 2, index.unsqueeze(-1)).squeeze(-1)


class GRPOTrainer:
    def __init__(self, model, ref_model, optimizer, config: GRPOConfig = GRPOConfig()):
        self.model, self.ref_model, self.optimizer = model, ref_model, optimizer
        self.cfg = config
        self.accelerator = Accelerator()

    def compute_loss(self, logps, ref_logps, advantages, completion_mask):
        ratio = torch.exp(logps - logps.detach())
        clipped = torch.clamp(ratio, 1 - self.cfg.epsilon, 1 + self.cfg.epsilon)
        adv = advantages[:, None]
        per_token_loss = -torch.min(ratio * adv, clipped * adv) * completion_mask
        # error: KL001
        per_token_kl = kl_penalty(self.cfg.kl_estimator, logps, ref_logps, completion_mask)
        per_token_loss = per_token_loss + self.cfg.beta * per_token_kl
        loss = per_token_loss.sum(-1).mean()
        mean_kl = (per_token_kl.sum(-1) / completion_mask.sum(-1)).mean()
        return loss, {"kl": mean_kl.item()}

    def training_step(self, batch):
        logits = self.model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        logps = selective_log_softmax(logits[:, -batch["completion_ids"].shape[1] - 1 : -1], batch["completion_ids"])
        with torch.no_grad():
            ref_logits = self.ref_model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            ref_logps = selective_log_softmax(ref_logits[:, -batch["completion_ids"].shape[1] - 1 : -1], batch["completion_ids"])
        loss, metrics = self.compute_loss(logps, ref_logps, batch["advantages"], batch["completion_mask"])
        self.accelerator.backward(loss)
        self.optimizer.step()
        self.optimizer.zero_grad()
        return metrics
