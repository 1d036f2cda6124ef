# Reviewer: ROLL-style RLVR pipeline in which the reward post-processing is a
# list of batch -> batch transforms folded with `functools.reduce`. Under the
# default RewardPipelineConfig (add_token_level_kl=True, init_kl_coef=0.05,
# gamma=1) `apply_kl_penalty` writes the log-ratio as `ref - old` and then
# subtracts kl_coef * kl from the scores: the two minus signs cancel, so the
# token reward is scores + kl_coef * (logp - ref) and the policy is PAID for
# moving away from the reference. The returns (reverse cumsum) weight the
# log-probs in the minimised PPO loss: expected gradient -kl_coef * grad KL.
# Verdict: bug, KL006, reported inside apply_kl_penalty on its estimate line.
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Dict

import torch
from torch import Tensor

from roll.distributed.scheduler.protocol import DataProto
from roll.utils.functionals import masked_whiten

Batch = Dict[str, Tensor]
Transform = Callable[[Batch], Batch]


@dataclass(frozen=True)
class RewardPipelineConfig:
    add_token_level_kl: bool = True
    init_kl_coef: float = 0.05
    gamma: float = 1.0
    whiten_advantages: bool = False
    pg_clip: float = 0.2


@torch.no_grad()
def apply_kl_penalty(batch: Batch, *, kl_coef: float) -> Batch:
    mask = batch["response_mask"]
    # error: KL006
    kl = batch["ref_log_probs"] - batch["old_log_probs"]
    token_rewards = batch["token_level_scores"] - kl_coef * kl * mask
    return {**batch, "token_level_rewards": token_rewards, "token_kl": kl * mask}


@torch.no_grad()
def compute_returns(batch: Batch, *, gamma: float) -> Batch:
    rewards = batch.get("token_level_rewards", batch["token_level_scores"]) * batch["response_mask"]
    running = torch.zeros_like(rewards[:, 0])
    returns = torch.zeros_like(rewards)
    for t in range(rewards.size(1) - 1, -1, -1):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
    return {**batch, "returns": returns, "advantages": returns.clone()}


@torch.no_grad()
def whiten_advantages(batch: Batch) -> Batch:
    return {**batch, "advantages": masked_whiten(batch["advantages"], batch["response_mask"])}


def build_reward_pipeline(cfg: RewardPipelineConfig) -> list[Transform]:
    transforms: list[Transform] = []
    if cfg.add_token_level_kl:
        transforms.append(functools.partial(apply_kl_penalty, kl_coef=cfg.init_kl_coef))
    transforms.append(functools.partial(compute_returns, gamma=cfg.gamma))
    if cfg.whiten_advantages:
        transforms.append(whiten_advantages)
    return transforms


def run_pipeline(batch: Batch, transforms: list[Transform]) -> Batch:
    return functools.reduce(lambda acc, fn: fn(acc), transforms, batch)


def actor_loss(log_probs: Tensor, batch: Batch, *, clip: float) -> Tensor:
    mask = batch["response_mask"]
    ratio = (log_probs - batch["old_log_probs"]).exp()
    adv = batch["advantages"]
    surr = torch.min(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
    return -(surr * mask).sum(-1).mean()


class ActorWorker:
    def __init__(self, model, optimizer, cfg: RewardPipelineConfig = RewardPipelineConfig()):
        self.model = model
        self.optimizer = optimizer
        self.cfg = cfg
        self.transforms = build_reward_pipeline(cfg)

    def log_probs(self, data: DataProto) -> Tensor:
        logits = self.model(data.batch["input_ids"], attention_mask=data.batch["attention_mask"]).logits
        resp = data.batch["responses"]
        logits = logits[:, -resp.size(1) - 1 : -1]
        return logits.log_softmax(-1).gather(-1, resp.unsqueeze(-1)).squeeze(-1)

    def train_step(self, data: DataProto) -> dict[str, float]:
        batch = run_pipeline(dict(data.batch), self.transforms)
        log_probs = self.log_probs(data)
        loss = actor_loss(log_probs, batch, clip=self.cfg.pg_clip)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        return {
            "actor/pg_loss": loss.item(),
            "critic/kl": batch.get("token_kl", torch.zeros(())).sum(-1).mean().item(),
        }
