# Reviewer: SkyRL-style trainer with use_kl_in_reward=True. `compute_approx_kl
# (log_probs, log_probs_base, loss_mask, kl_estimator_type)` takes the policy
# log-probs FIRST; `apply_reward_kl_penalty` calls it with the arguments swapped
# (base first), so with the default kl_estimator_type="k1" it returns
# ref - logp = -logr. The reward `rewards - kl_coef * kl` is then
# rewards + kl_coef * logr: the KL is a bonus. Returns are a reverse cumulative
# sum (gamma = 1), so the KL part of the PolicyLoss gradient is
# +kl_coef * grad KL(pi||pi_ref): minimising the loss increases the KL.
# Verdict: bug, KL006, reported inside apply_reward_kl_penalty on its
# compute_approx_kl call (where the minus sign is written, by argument order).
from dataclasses import dataclass

import torch
import torch.nn as nn

from skyrl_train.training_batch import TrainingInputBatch
from skyrl_train.utils.ppo_utils import AdvantageEstimatorRegistry


@dataclass
class AlgorithmConfig:
    use_kl_in_reward: bool = True
    use_kl_loss: bool = False
    kl_estimator_type: str = "k1"
    kl_coef: float = 0.02
    eps_clip_low: float = 0.2
    eps_clip_high: float = 0.2
    max_seq_len: int = 1024


def compute_approx_kl(log_probs, log_probs_base, loss_mask=None, kl_estimator_type="k3"):
    log_ratio = log_probs - log_probs_base
    if kl_estimator_type == "k1":
        kl = log_ratio
    elif kl_estimator_type == "k2":
        kl = 0.5 * log_ratio.pow(2)
    elif kl_estimator_type == "k3":
        kl = torch.exp(-log_ratio) - 1 + log_ratio
    elif kl_estimator_type == "abs":
        kl = log_ratio.abs()
    else:
        raise ValueError(kl_estimator_type)
    return kl if loss_mask is None else kl * loss_mask


@torch.no_grad()
def apply_reward_kl_penalty(data, kl_coef, kl_estimator_type):
    loss_mask = data["loss_mask"]
    # error: KL006
    kl = compute_approx_kl(data["base_action_log_probs"], data["action_log_probs"], loss_mask, kl_estimator_type=kl_estimator_type)
    data["rewards"] = data["rewards"] - kl_coef * kl
    data["metrics/kl"] = kl.sum(-1).mean().item()
    return data


@torch.no_grad()
def compute_reinforce_returns(rewards, loss_mask):
    returns = (rewards * loss_mask).flip(-1).cumsum(-1).flip(-1)
    return returns * loss_mask


class PolicyLoss(nn.Module):
    def __init__(self, cfg: AlgorithmConfig = AlgorithmConfig()):
        super().__init__()
        self.cfg = cfg

    def forward(self, log_probs, old_log_probs, advantages, loss_mask):
        ratio = (log_probs - old_log_probs).exp()
        surr1 = ratio * advantages
        surr2 = ratio.clamp(1 - self.cfg.eps_clip_low, 1 + self.cfg.eps_clip_high) * advantages
        loss = -torch.min(surr1, surr2)
        return (loss * loss_mask).sum() / (loss.size(0) * self.cfg.max_seq_len)


def prepare_batch(data, cfg: AlgorithmConfig = AlgorithmConfig()):
    if cfg.use_kl_in_reward:
        data = apply_reward_kl_penalty(data, cfg.kl_coef, cfg.kl_estimator_type)
    data["advantages"] = compute_reinforce_returns(data["rewards"], data["loss_mask"])
    return data


def ppo_train_step(policy_loss_fn: PolicyLoss, data, log_probs):
    loss = policy_loss_fn(log_probs, data["action_log_probs"], data["advantages"], data["loss_mask"])
    return loss, {"policy_loss": loss.item()}
