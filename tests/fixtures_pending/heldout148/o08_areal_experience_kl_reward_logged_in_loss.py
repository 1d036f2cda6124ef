# Reviewer: AReaL-style PPO actor with a critic, same skeleton as e08, with
# kl_in_loss=False (the default here): the per-token KL computed under no_grad
# in prepare_experience is the log-ratio k1 and goes into the rewards,
# -kl_ctl * kl, credited by GAE with discount = gae_lambda = 1. The actor's PPO
# loss weights log-probs by those advantages: expected KL gradient
# kl_ctl * grad KL(pi||pi_ref) of the sequence. The stored KL also appears in
# ppo_loss, but only inside a logged statistic (no addition to the loss).
# Verdict: correct. The detached estimate is a reward, not a loss term.
from dataclasses import dataclass

import torch

from areal.api.cli_args import PPOActorConfig
from areal.utils import stats_tracker


@dataclass
class KLConfig:
    kl_ctl: float = 0.1
    kl_in_loss: bool = False
    discount: float = 1.0
    gae_lambda: float = 1.0
    eps_clip: float = 0.2
    max_new_tokens: int = 1024


class PPOActor:
    def __init__(self, cfg: KLConfig, engine=None):
        self.cfg = cfg
        self.engine = engine

    @torch.no_grad()
    def prepare_experience(self, data):
        mask = data["loss_mask"].to(data["logprobs"].dtype)
        # ok: KL005
        kl = data["logprobs"] - data["ref_logp"]
        rewards = torch.zeros_like(data["logprobs"])
        if not self.cfg.kl_in_loss:
            rewards = rewards - self.cfg.kl_ctl * kl * mask
        last = mask.long().cumsum(-1).argmax(-1)
        rewards[torch.arange(mask.shape[0]), last] += data["rewards"]
        values = data["values"] * mask
        adv = torch.zeros_like(rewards)
        lastgaelam = torch.zeros_like(rewards[:, 0])
        T = rewards.shape[1]
        for t in reversed(range(T)):
            nextvalues = values[:, t + 1] if t + 1 < T else 0.0
            delta = rewards[:, t] + self.cfg.discount * nextvalues - values[:, t]
            lastgaelam = delta + self.cfg.discount * self.cfg.gae_lambda * lastgaelam
            adv[:, t] = lastgaelam
        data["advantages"] = adv * mask
        data["returns"] = (adv + values) * mask
        data["kl"] = kl * mask
        return data

    def ppo_loss(self, logprobs, data):
        mask = data["loss_mask"].to(logprobs.dtype)
        ratio = torch.exp(logprobs - data["logprobs"])
        adv = data["advantages"]
        clipped = torch.clamp(ratio, 1.0 - self.cfg.eps_clip, 1.0 + self.cfg.eps_clip)
        pg = -torch.min(ratio * adv, clipped * adv)
        if self.cfg.kl_in_loss:
            pg = pg + self.cfg.kl_ctl * data["kl"]
        loss = (pg * mask).sum(-1).mean() / self.cfg.max_new_tokens
        self.last_stats = {"loss": loss.detach(), "kl_per_seq": data["kl"].sum(-1).mean()}
        return loss

    def ppo_update(self, data):
        data = self.prepare_experience(data)
        logprobs = self.engine.forward(data)
        loss = self.ppo_loss(logprobs, data)
        loss.backward()
        stats_tracker.scalar(**{k: v.item() for k, v in self.last_stats.items()})
        return loss
