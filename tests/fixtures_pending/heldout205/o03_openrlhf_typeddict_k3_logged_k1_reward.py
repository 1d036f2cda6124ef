# Reviewer: OpenRLHF-style PPO actor trainer, same skeleton as e03 (TypedDict
# `Experience`, `approx_kl(..., estimator=...)`, a tuple returned by
# `_actor_loss` and unpacked with a starred target). Here the KL is a REWARD:
# make_experience (no_grad) puts -coef * k1 in the per-token rewards and turns
# them into returns by a reverse cumulative sum (gamma = 1), which weight the
# log-probs in the clipped surrogate: exactly coef * grad KL(pi||pi_ref) of the
# sequence. `_actor_loss` still computes the default k3 with gradient, but only
# as a diagnostic: it is the second element of the tuple, bound to `approx`,
# read with `.item()` and never added to the loss (use_kl_loss=False).
# Verdict: correct. The live k3 in `_actor_loss` and the k1 reward stay silent.
from dataclasses import dataclass
from typing import TypedDict

import torch

from openrlhf.models import Actor


class Experience(TypedDict):
    sequences: torch.Tensor
    action_log_probs: torch.Tensor
    base_action_log_probs: torch.Tensor
    advantages: torch.Tensor
    action_mask: torch.Tensor
    info: dict


@dataclass
class TrainArgs:
    eps_clip: float = 0.2
    use_kl_loss: bool = False
    kl_estimator: str = "k3"
    init_kl_coef: float = 0.01


def approx_kl(log_probs, base_log_probs, estimator="k1"):
    delta = log_probs - base_log_probs
    table = {
        "k1": lambda d: d,
        "k2": lambda d: 0.5 * d.pow(2),
        # ok: KL002
        "k3": lambda d: torch.expm1(-d) + d,
    }
    return table[estimator](delta)


def clipped_surrogate(log_probs, old_log_probs, advantages, mask, eps):
    ratio = (log_probs - old_log_probs).exp()
    surr = torch.min(ratio * advantages, ratio.clamp(1 - eps, 1 + eps) * advantages)
    clipfrac = ((ratio - 1).abs() > eps).float().mean()
    return -(surr * mask).sum(-1).mean(), clipfrac


class ActorPPOTrainer:
    def __init__(self, actor: Actor, strategy, optimizer, args: TrainArgs = TrainArgs()):
        self.actor = actor
        self.strategy = strategy
        self.optimizer = optimizer
        self.args = args

    @torch.no_grad()
    def make_experience(self, sequences, action_mask, scores, base_action_log_probs, action_log_probs=None) -> Experience:
        if action_log_probs is None:
            action_log_probs = self.actor(sequences, action_mask.shape[1])
        # ok: KL001
        kl = approx_kl(action_log_probs, base_action_log_probs, estimator="k1")
        rewards = -self.args.init_kl_coef * kl * action_mask
        last = action_mask.sum(-1).long() - 1
        rewards[torch.arange(rewards.shape[0]), last] += scores
        returns = rewards.flip(-1).cumsum(-1).flip(-1) * action_mask
        return Experience(sequences=sequences, action_log_probs=action_log_probs,
                          base_action_log_probs=base_action_log_probs, advantages=returns,
                          action_mask=action_mask, info={"score": scores, "kl": kl.sum(-1)})

    def _actor_loss(self, experience: Experience, action_log_probs):
        mask = experience["action_mask"]
        pg_loss, clipfrac = clipped_surrogate(
            action_log_probs, experience["action_log_probs"], experience["advantages"], mask, self.args.eps_clip
        )
        # ok: KL002
        kl = approx_kl(action_log_probs, experience["base_action_log_probs"], estimator=self.args.kl_estimator)
        approx = (kl * mask).sum(-1).mean()
        if self.args.use_kl_loss:
            return pg_loss + self.args.init_kl_coef * approx, approx, clipfrac
        return pg_loss, approx, clipfrac

    def training_step(self, experience: Experience):
        self.actor.train()
        action_log_probs = self.actor(experience["sequences"], experience["action_mask"].shape[1])
        loss, approx, *_ = self._actor_loss(experience, action_log_probs)
        self.strategy.backward(loss, self.actor, self.optimizer)
        self.strategy.optimizer_step(self.optimizer, self.actor)
        return {"actor_loss": loss.item(), "approx_kl": approx.item()}
