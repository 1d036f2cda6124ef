# Reviewer: AReaL-style PPO actor. The KL estimator is a functools.partial stored in the
# actor config: partial(kl_divergence, kind="low_var_kl", level="sequence"). With
# level="sequence" the log-ratio is summed over the response first and k3 is applied to
# the SEQUENCE log-ratio, exp(-L) + L - 1. Differentiated as a loss, its gradient is
# (1 - exp(-L)) * sum_t grad logp_t, whose expectation is exactly grad KL(pi_ref||pi) of
# the sequence: the divergence with its arguments swapped.
# Verdict: bug, KL002, reported on the `kl = self.config.kl_fn(...)` call in
# PPOActor.ppo_loss (the partial's function returns the estimate; the loss calls it).
from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import torch

from areal.api.engine_api import TrainEngine
from areal.utils.functional import gather_logprobs


def kl_divergence(logprobs, ref_logprobs, loss_mask, kind: str = "k1", level: str = "token"):
    log_ratio = (logprobs - ref_logprobs) * loss_mask
    if level == "sequence":
        log_ratio = log_ratio.sum(-1)
    if kind == "k1":
        return log_ratio
    if kind == "mse":
        return 0.5 * log_ratio.square()
    if kind == "low_var_kl":
        return torch.exp(-log_ratio) + log_ratio - 1
    raise ValueError(f"unknown KL kind {kind}")


@dataclass
class PPOActorConfig:
    eps_clip: float = 0.2
    kl_ctl: float = 0.05
    kl_fn: Callable = field(default_factory=lambda: partial(kl_divergence, kind="low_var_kl", level="sequence"))


class PPOActor:
    def __init__(self, config: PPOActorConfig = PPOActorConfig(), engine: TrainEngine = None):
        self.config = config
        self.engine = engine

    def ppo_loss(self, logprobs, old_logprobs, ref_logprobs, advantages, loss_mask):
        ratio = torch.exp(logprobs - old_logprobs)
        clipped = ratio.clamp(1 - self.config.eps_clip, 1 + self.config.eps_clip)
        pg = -torch.min(ratio * advantages, clipped * advantages)
        pg_loss = (pg * loss_mask).sum(-1).mean()
        # error: KL002
        kl = self.config.kl_fn(logprobs, ref_logprobs, loss_mask)
        loss = pg_loss + self.config.kl_ctl * kl.mean()
        stats = {"pg_loss": pg_loss.detach(), "kl": kl.detach().mean()}
        return loss, stats

    def ppo_update(self, data: dict):
        def loss_fn(logits, batch):
            logprobs = gather_logprobs(logits, batch["rolled_input_ids"])
            loss, _ = self.ppo_loss(
                logprobs, batch["logprobs"], batch["ref_logp"], batch["advantages"], batch["loss_mask"]
            )
            return loss

        return self.engine.train_batch(data, loss_fn=loss_fn, loss_weight_fn=lambda x: x["loss_mask"].count_nonzero())
