# Reviewer: AReaL-style PPO actor on a TypedDict rollout batch. The KL term is
# found by a mapping pattern, `case {"logprobs": Tensor() as lp,
# "ref_logprobs": Tensor() as ref_lp}` with a guard on kl_ctl, and uses k2 of
# the SEQUENCE log-ratio (a correct estimator). But `batch["logprobs"]` holds
# the inference engine's rollout log-probs (no gradient; the proximal/old
# policy), not the recomputed `logprobs` argument: the KL term is built only
# from detached log-probs and is then added to the loss. Its gradient is
# exactly zero.
# Verdict: bug, KL005, reported on the `kl = 0.5 * ...` line inside the mapping case.
from dataclasses import dataclass
from typing import TypedDict

import torch
from torch import Tensor

from areal.utils.functional import gather_logprobs


class RolloutBatch(TypedDict):
    input_ids: Tensor
    loss_mask: Tensor
    logprobs: Tensor  # from the rollout engine (SGLang/vLLM), no grad
    ref_logprobs: Tensor
    advantages: Tensor


@dataclass(slots=True, kw_only=True)
class PPOActorConfig:
    eps_clip: float = 0.2
    kl_ctl: float = 0.05
    temperature: float = 1.0


def ppo_actor_loss_fn(logprobs: Tensor, batch: RolloutBatch, cfg: PPOActorConfig) -> tuple[Tensor, dict[str, float]]:
    mask = batch["loss_mask"].float()
    old_logprobs = batch["logprobs"]
    ratio = torch.exp(logprobs - old_logprobs)
    adv = batch["advantages"]
    pg_loss = (torch.max(-adv * ratio, -adv * ratio.clamp(1 - cfg.eps_clip, 1 + cfg.eps_clip)) * mask).sum(-1).mean()
    stats = {"pg_loss": pg_loss.item()}
    loss = pg_loss

    match batch:
        case {"logprobs": Tensor() as lp, "ref_logprobs": Tensor() as ref_lp} if cfg.kl_ctl > 0:
            # error: KL005
            kl = 0.5 * ((lp - ref_lp) * mask).sum(-1).square()
            loss = loss + cfg.kl_ctl * kl.mean()
            stats["kl"] = kl.mean().item()
        case {"logprobs": Tensor()}:
            stats["kl"] = 0.0
        case _:
            raise KeyError("rollout batch without logprobs")
    return loss, stats


class PPOActor:
    def __init__(self, cfg: PPOActorConfig, engine) -> None:
        self.cfg, self.engine = cfg, engine

    def train_batch(self, batch: RolloutBatch) -> dict[str, float]:
        logits = self.engine.forward(input_ids=batch["input_ids"]) / self.cfg.temperature
        logprobs = gather_logprobs(logits[:, :-1], batch["input_ids"][:, 1:])
        loss, stats = ppo_actor_loss_fn(logprobs, batch, self.cfg)
        self.engine.optimizer.zero_grad()
        loss.backward()
        self.engine.optimizer.step()
        return stats
