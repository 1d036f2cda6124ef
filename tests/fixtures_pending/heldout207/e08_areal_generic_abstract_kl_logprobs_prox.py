# Reviewer: AReaL-style actor loss as a generic template class.
# `RegularizedActorLoss(ABC, Generic[BatchT])` computes, in __call__, the
# subclass's policy term plus kl_ctl times k2 of the SEQUENCE log-ratio (a
# correct estimator), built from whatever the abstract `kl_logprobs()` hook
# returns. The default loss (make_actor_loss, `loss_type="decoupled"`) is
# DecoupledPPOLoss, whose hook returns the stored proximal-policy log-probs
# `batch["prox_logp"]` (no gradient), not the fresh `logprobs`. The KL term
# reaches the loss as a constant: its gradient is exactly zero.
# Verdict: bug, KL005, reported where __call__ calls the estimate helper
# (`kl = self.sequence_kl(...)`).
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Dict, Generic, TypeVar

import torch
from areal.api.cli_args import PPOActorConfig
from areal.utils.data import KLEstimator

BatchT = TypeVar("BatchT", bound=Dict[str, torch.Tensor])


class RegularizedActorLoss(ABC, Generic[BatchT]):
    def __init__(self, kl_ctl: float, eps_clip: float):
        self.kl_ctl = kl_ctl
        self.eps_clip = eps_clip

    @abstractmethod
    def policy_term(self, logprobs: torch.Tensor, batch: BatchT) -> torch.Tensor: ...

    @abstractmethod
    def kl_logprobs(self, logprobs: torch.Tensor, batch: BatchT) -> torch.Tensor: ...

    @staticmethod
    def sequence_kl(logp, ref_logp, mask):
        seq_log_ratio = ((logp - ref_logp) * mask).sum(-1)
        return 0.5 * seq_log_ratio.square()

    def __call__(self, logprobs: torch.Tensor, batch: BatchT):
        mask = batch["loss_mask"]
        loss = self.policy_term(logprobs, batch)
        # error: KL005
        kl = self.sequence_kl(self.kl_logprobs(logprobs, batch), batch["ref_logp"], mask)
        loss = loss + self.kl_ctl * kl.mean()
        return loss, {"kl": kl.mean().detach(), "loss": loss.detach()}


class DecoupledPPOLoss(RegularizedActorLoss[Dict[str, torch.Tensor]]):
    def policy_term(self, logprobs, batch):
        mask = batch["loss_mask"]
        behav_imp_weight = (batch["prox_logp"] - batch["logprobs"]).exp().clamp(max=5.0)
        ratio = (logprobs - batch["prox_logp"]).exp()
        adv = batch["advantages"]
        surr = torch.min(ratio * adv, ratio.clamp(1 - self.eps_clip, 1 + self.eps_clip) * adv)
        return -(behav_imp_weight * surr * mask).sum(-1).mean()

    def kl_logprobs(self, logprobs, batch):
        return batch["prox_logp"]


class VanillaPPOLoss(RegularizedActorLoss[Dict[str, torch.Tensor]]):
    def policy_term(self, logprobs, batch):
        ratio = (logprobs - batch["logprobs"]).exp()
        adv = batch["advantages"]
        surr = torch.min(ratio * adv, ratio.clamp(1 - self.eps_clip, 1 + self.eps_clip) * adv)
        return -(surr * batch["loss_mask"]).sum(-1).mean()

    def kl_logprobs(self, logprobs, batch):
        return logprobs


@dataclass
class ActorLossConfig:
    loss_type: str = "decoupled"
    kl_ctl: float = 0.1
    eps_clip: float = 0.2


def make_actor_loss(cfg: ActorLossConfig = ActorLossConfig()) -> RegularizedActorLoss:
    cls = {"decoupled": DecoupledPPOLoss, "vanilla": VanillaPPOLoss}[cfg.loss_type]
    return cls(cfg.kl_ctl, cfg.eps_clip)


def ppo_update(engine, batch, cfg: ActorLossConfig = ActorLossConfig()):
    loss_fn = make_actor_loss(cfg)
    logprobs = engine.forward_logprobs(batch)
    loss, stats = loss_fn(logprobs, batch)
    loss.backward()
    engine.step()
    return stats
