# Reviewer: verl-style split of a Ray rollout worker (vLLM) and an actor
# learner, as e05, but BOTH halves of the k3 penalty run, with the same
# cfg.kl_coef: the worker puts -kl_coef * k3 into the per-token rewards (numpy,
# credited by the learner's reverse-cumsum returns) and the actor adds
# kl_coef * k3 with its gradient. The reward half gives fwd - token-level rev,
# the loss half the token-level rev: the sum is grad KL(pi||pi_ref) exactly.
# Verdict: correct ("both", across two classes). Neither k3 line is a finding.
from dataclasses import dataclass

import numpy as np
import torch

from verl.single_controller.base import Worker
from verl.workers.rollout.vllm_rollout import vLLMRollout


@dataclass
class AlgoConfig:
    kl_coef: float = 0.01
    clip_ratio: float = 0.2
    loss_scale: float = 1.0 / 512


@dataclass
class RolloutBatch:
    old_log_probs: np.ndarray
    ref_log_probs: np.ndarray
    response_mask: np.ndarray
    token_level_rewards: np.ndarray


class RolloutWorker:
    def __init__(self, cfg: AlgoConfig, rollout: vLLMRollout = None, ref_policy=None, reward_fn=None):
        self.cfg, self.rollout, self.ref_policy, self.reward_fn = cfg, rollout, ref_policy, reward_fn

    def generate_sequences(self, prompts):
        out = self.rollout.generate_sequences(prompts)
        ref = self.ref_policy.compute_ref_log_prob(out)
        scores = self.reward_fn(out)
        return self.postprocess(out["old_log_probs"], ref, out["response_mask"], scores)

    def postprocess(self, old_lp, ref_lp, mask, scores):
        log_ratio = old_lp - ref_lp
        # ok: KL004
        k3 = np.exp(-log_ratio) - 1.0 + log_ratio
        rewards = -self.cfg.kl_coef * k3 * mask
        last = mask.sum(-1).astype(np.int64) - 1
        rewards[np.arange(len(last)), last] += scores
        return RolloutBatch(old_lp, ref_lp, mask, rewards)


class ActorLearner:
    def __init__(self, cfg: AlgoConfig, actor=None, optimizer=None):
        self.cfg, self.actor, self.optimizer = cfg, actor, optimizer

    def compute_loss(self, log_prob, rb: RolloutBatch):
        old = torch.from_numpy(rb.old_log_probs)
        ref = torch.from_numpy(rb.ref_log_probs)
        mask = torch.from_numpy(rb.response_mask)
        rewards = torch.from_numpy(rb.token_level_rewards)
        returns = rewards.flip(-1).cumsum(-1).flip(-1)
        ratio = torch.exp(log_prob - old)
        pg = -torch.min(ratio * returns, ratio.clamp(1 - self.cfg.clip_ratio, 1 + self.cfg.clip_ratio) * returns)
        ref_ratio = torch.exp(ref - log_prob)
        # ok: KL002
        kld = ref_ratio - torch.log(ref_ratio) - 1
        loss = ((pg + self.cfg.kl_coef * kld) * mask).sum(-1).mean()
        return loss * self.cfg.loss_scale

    def update_actor(self, rb: RolloutBatch, input_ids):
        log_prob = self.actor.compute_log_prob(input_ids)
        loss = self.compute_loss(log_prob, rb)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {"actor/loss": loss.item()}
