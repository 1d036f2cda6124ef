# Reviewer: AReaL-style actor objective assembled from two families of modules:
# TokenLoss (forward -> compute, with gradient) and TokenStat, whose forward is
# decorated with @torch.no_grad() because stats are only logged. The reference
# KL term RefKLPenalty computes k2 of the sequence log-ratio (a correct
# estimator) but derives from TokenStat, so the inherited forward runs it under
# no_grad; it is still registered in the `losses` ModuleDict and summed into the
# loss. The KL term is a constant for autograd: zero gradient.
# Verdict: bug, KL005, reported inside RefKLPenalty.compute (given only the
# batch, called from one place) on the line that computes the estimate.
from dataclasses import dataclass

import torch
import torch.nn as nn

from areal.api.cli_args import PPOActorConfig
from areal.utils import stats_tracker


@dataclass
class ActorLossConfig:
    eps_clip: float = 0.2
    kl_ctl: float = 0.1


class TokenLoss(nn.Module):
    def forward(self, batch):
        return self.compute(batch)

    def compute(self, batch):
        raise NotImplementedError


class TokenStat(nn.Module):
    @torch.no_grad()
    def forward(self, batch):
        return self.compute(batch)

    def compute(self, batch):
        raise NotImplementedError


class PPOActorLoss(TokenLoss):
    def __init__(self, eps_clip: float):
        super().__init__()
        self.eps_clip = eps_clip

    def compute(self, batch):
        ratio = torch.exp(batch["logprobs"] - batch["prox_logp"])
        adv = batch["advantages"].unsqueeze(-1)
        loss = -torch.min(ratio * adv, ratio.clamp(1 - self.eps_clip, 1 + self.eps_clip) * adv)
        return (loss * batch["loss_mask"]).sum(-1).mean()


class ClipFractionStat(TokenStat):
    def __init__(self, eps_clip: float):
        super().__init__()
        self.eps_clip = eps_clip

    def compute(self, batch):
        ratio = torch.exp(batch["logprobs"] - batch["prox_logp"])
        clipped = ((ratio - 1).abs() > self.eps_clip).float()
        return (clipped * batch["loss_mask"]).sum() / batch["loss_mask"].sum().clamp(min=1)


class RefKLPenalty(TokenStat):
    def __init__(self, kl_ctl: float):
        super().__init__()
        self.kl_ctl = kl_ctl

    def compute(self, batch):
        mask = batch["loss_mask"]
        # error: KL005
        seq_kl = 0.5 * ((batch["logprobs"] - batch["ref_logp"]) * mask).sum(-1).square()
        return self.kl_ctl * seq_kl.mean()


class ActorObjective(nn.Module):
    def __init__(self, cfg: ActorLossConfig):
        super().__init__()
        self.losses = nn.ModuleDict({"ppo": PPOActorLoss(cfg.eps_clip)})
        if cfg.kl_ctl > 0:
            self.losses["ref_kl"] = RefKLPenalty(cfg.kl_ctl)
        self.stats = nn.ModuleDict({"clip_frac": ClipFractionStat(cfg.eps_clip)})

    def forward(self, batch):
        loss = sum(term(batch) for term in self.losses.values())
        logged = {name: float(stat(batch)) for name, stat in self.stats.items()}
        return loss, logged


class PPOActor:
    def __init__(self, config: PPOActorConfig, engine):
        self.engine = engine
        self.objective = ActorObjective(ActorLossConfig(eps_clip=config.eps_clip, kl_ctl=config.kl_ctl))

    def ppo_update(self, batch: dict):
        def loss_fn(logprobs, mb):
            loss, logged = self.objective({**mb, "logprobs": logprobs})
            stats_tracker.scalar(**logged)
            return loss

        return self.engine.train_batch(batch, loss_fn=loss_fn)
