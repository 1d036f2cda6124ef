# Reviewer: SkyRL-style soft (maximum-entropy) REINFORCE. A helper of this file,
# compute_soft_token_rewards, runs under torch.no_grad() and builds the per-token
# rewards itself: the entropy bonus -alpha * log pi(y_t) (soft RL with temperature
# alpha) and a KL penalty -kl_coef * KL_t, where KL_t is the k3 estimate
# exp(-logr) + logr - 1. Returns are a reverse cumulative sum (gamma = 1) and weight the
# log-probs. A k3 reward has expected gradient grad KL(pi||pi_ref) minus the token-level
# grad KL(pi_ref||pi): biased, nearly no push near the reference.
# Verdict: bug, KL004, reported inside the reward helper on its k3 line.
from dataclasses import dataclass

import torch

from skyrl_train.training_batch import TrainingInputBatch
from skyrl_train.utils.ppo_utils import masked_mean


@dataclass
class SoftRLConfig:
    alpha: float = 0.01
    kl_coef: float = 0.1
    use_kl_in_reward: bool = True


@torch.no_grad()
def compute_soft_token_rewards(scores, log_probs, base_log_probs, loss_mask, alpha, kl_coef, use_kl):
    entropy_bonus = -alpha * log_probs
    rewards = entropy_bonus
    if use_kl:
        log_ratio = log_probs - base_log_probs
        # error: KL004
        kl = torch.exp(-log_ratio) + log_ratio - 1
        rewards = rewards - kl_coef * kl
    rewards = rewards * loss_mask
    last = loss_mask.sum(-1).long() - 1
    rewards[torch.arange(rewards.size(0)), last] += scores
    return rewards


def compute_returns(rewards, loss_mask):
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.size(1))):
        running = rewards[:, t] + running * loss_mask[:, t]
        returns[:, t] = running
    return returns * loss_mask


def soft_policy_loss(log_probs, returns, loss_mask):
    return -(returns * log_probs * loss_mask).sum(-1).mean()


class SoftReinforceWorker:
    def __init__(self, cfg: SoftRLConfig, policy=None, optimizer=None):
        self.cfg = cfg
        self.policy = policy
        self.optimizer = optimizer

    def loss_from_logprobs(self, log_probs, base_log_probs, scores, loss_mask):
        cfg = self.cfg
        rewards = compute_soft_token_rewards(
            scores, log_probs.detach(), base_log_probs, loss_mask, cfg.alpha, cfg.kl_coef, cfg.use_kl_in_reward
        )
        returns = compute_returns(rewards, loss_mask)
        return soft_policy_loss(log_probs, returns, loss_mask)

    def training_step(self, batch: TrainingInputBatch):
        log_probs = self.policy.log_probs(batch["sequences"], batch["attention_mask"], batch["num_actions"])
        loss = self.loss_from_logprobs(log_probs, batch["base_action_log_probs"], batch["scores"], batch["loss_mask"])
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {"policy_loss": loss.item(), "entropy": masked_mean(-log_probs.detach(), batch["loss_mask"]).item()}
