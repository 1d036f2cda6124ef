# Reviewer: OpenRLHF-style REINFORCE experience. `Experience` is a dataclass
# whose functools.cached_property `kl_rewards` builds the per-token rewards
# under torch.no_grad(): it matches on the StrEnum estimator (default
# KLEstimator.K3, via an or-pattern `K3 | LOW_VAR_KL`), subtracts
# `kl_coef * k3` from every token and adds the score at the last token; the
# cached property `returns` is their reverse cumulative sum (gamma = 1). The
# policy loss weights the fresh log-probs by these returns. A k3 reward gives
# grad KL(pi||pi_ref) minus the token-level grad KL(pi_ref||pi): biased.
# Verdict: bug, KL004, reported inside the `kl_rewards` property, on the k3 line.
import enum
from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor

from openrlhf.models.utils import masked_mean


class KLEstimator(enum.StrEnum):
    K1 = "k1"
    K3 = "k3"
    LOW_VAR_KL = "low_var_kl"
    NONE = "none"


@dataclass(kw_only=True)
class Experience:
    sequences: Tensor
    action_log_probs: Tensor  # rollout policy, no grad
    base_action_log_probs: Tensor  # reference model
    action_mask: Tensor
    scores: Tensor  # [B], reward model at the last token
    kl_coef: float = 0.01
    kl_estimator: KLEstimator = KLEstimator.K3

    @cached_property
    def kl_rewards(self) -> Tensor:
        mask = self.action_mask
        with torch.no_grad():
            log_ratio = (self.action_log_probs - self.base_action_log_probs) * mask
            match self.kl_estimator:
                case KLEstimator.NONE:
                    kl = torch.zeros_like(log_ratio)
                case KLEstimator.K1:
                    kl = log_ratio
                case KLEstimator.K3 | KLEstimator.LOW_VAR_KL:
                    # error: KL004
                    kl = (-log_ratio).exp() - 1 + log_ratio
            rewards = -self.kl_coef * kl * mask
            last = mask.sum(-1).long() - 1
            rewards[torch.arange(rewards.size(0)), last] += self.scores
        return rewards

    @cached_property
    def returns(self) -> Tensor:
        return (self.kl_rewards * self.action_mask).flip(-1).cumsum(-1).flip(-1)


class PolicyLoss:
    def __init__(self, clip_eps: float = 0.2) -> None:
        self.clip_eps = clip_eps

    def __call__(self, log_probs: Tensor, exp: Experience) -> Tensor:
        ratio = (log_probs - exp.action_log_probs).exp()
        adv = exp.returns
        surr = torch.min(ratio * adv, ratio.clamp(1 - self.clip_eps, 1 + self.clip_eps) * adv)
        return -(surr * exp.action_mask).sum(-1).mean()


def training_step(actor, optimizer, loss_fn: PolicyLoss, exp: Experience) -> dict[str, float]:
    log_probs = actor(exp.sequences, action_mask=exp.action_mask)
    loss = loss_fn(log_probs, exp)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return {"policy_loss": loss.item(), "return": masked_mean(exp.returns[:, 0:1], exp.action_mask[:, 0:1]).item()}
