# Reviewer: oat-style PPO learner. The regulariser is typed by a
# `typing.Protocol` (KLRegularizer) and built by a factory; the only concrete
# implementation, SequenceKLReward, returns the KL as a *reward*,
# -0.5 * (sum_t mask_t logr_t)^2 per sequence (k2 of the sequence log-ratio,
# negated). The learner copies its frozen args with `dataclasses.replace` to
# insert the adaptive beta and then ADDS `beta * kl_reward` to the minimised
# loss, as if it were a penalty. The gradient is -beta * grad KL(pi||pi_ref)
# of the sequence: descent increases the KL.
# Verdict: bug, KL006, reported where learning_step calls the regulariser
# (`kl_reward = self.kl_reg(...)`): the minus sign is inside the helper.
import dataclasses
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from oat.learners.base import LearnerBase
from oat.utils.ops import masked_sum


@runtime_checkable
class KLRegularizer(Protocol):
    def __call__(self, logps: torch.Tensor, ref_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Per-sequence KL reward (higher is closer to the reference)."""


class SequenceKLReward:
    def __call__(self, logps, ref_logps, mask):
        seq_log_ratio = ((logps - ref_logps) * mask).sum(-1)
        return -0.5 * seq_log_ratio.pow(2)


def make_regularizer(name: str) -> KLRegularizer:
    if name == "seq_k2":
        return SequenceKLReward()
    raise ValueError(name)


@dataclass(frozen=True)
class PPOArgs:
    beta: float = 0.05
    target_kl: float = 6.0
    clip_range: float = 0.2
    kl_regularizer: str = "seq_k2"
    generate_max_length: int = 512


class AdaptiveKLController:
    def __init__(self, init_beta: float, target: float, horizon: int = 10000):
        self.value = init_beta
        self.target = target
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int):
        error = max(min(current_kl / self.target - 1, 0.2), -0.2)
        self.value *= 1 + error * n_steps / self.horizon


class PPOLearner:
    def __init__(self, args: PPOArgs):
        self.args = args
        self.kl_reg: KLRegularizer = make_regularizer(args.kl_regularizer)
        self.kl_ctl = AdaptiveKLController(args.beta, args.target_kl)

    def learning_step(self, logps, old_logps, ref_logps, advantages, mask):
        args = dataclasses.replace(self.args, beta=self.kl_ctl.value)
        ratio = torch.exp(logps - old_logps)
        pg1 = -advantages[:, None] * ratio
        pg2 = -advantages[:, None] * ratio.clamp(1 - args.clip_range, 1 + args.clip_range)
        pg_loss = (torch.max(pg1, pg2) * mask).sum(-1).mean() / args.generate_max_length
        # error: KL006
        kl_reward = self.kl_reg(logps, ref_logps, mask)
        loss = pg_loss + args.beta * kl_reward.mean()
        infos = {"pg_loss": pg_loss.detach(), "kl": -kl_reward.detach().mean(), "beta": args.beta}
        return loss, infos

    def train_batch(self, batch, optimizer):
        loss, infos = self.learning_step(batch["logps"], batch["old_logps"], batch["ref_logps"], batch["advantages"], batch["mask"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        self.kl_ctl.update(float(infos["kl"]), batch["mask"].size(0))
        return infos
