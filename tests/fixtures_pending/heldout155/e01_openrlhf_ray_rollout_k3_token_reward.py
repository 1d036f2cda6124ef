# Reviewer: OpenRLHF-style Ray rollout worker. The worker gets engine log-probs
# from vLLM and reference log-probs from a ref replica (numpy, no autograd) and
# writes a per-token KL penalty into Experience.token_rewards. The estimator is
# k3, spelled np.expm1(-x) + x. The learner (same file) turns the rewards into
# returns by a reverse loop (gamma = 1) and weights the PPO ratio with them. A
# k3 reward credited by returns has expected gradient grad KL(pi||pi_ref) minus
# the token-level partial gradient of KL(pi_ref||pi): biased.
# Verdict: bug, KL004, reported where the worker computes the k3 estimate.
from dataclasses import dataclass, field
from typing import List

import numpy as np
import torch

import ray
from vllm import SamplingParams


@dataclass
class RolloutConfig:
    init_kl_coef: float = 0.02
    max_new_tokens: int = 1024
    temperature: float = 1.0


@dataclass
class Experience:
    response_ids: List[np.ndarray]
    engine_logprobs: List[np.ndarray]
    token_rewards: List[np.ndarray] = field(default_factory=list)


class RolloutWorker:
    """Ray actor holding one vLLM engine and a reference-model replica."""

    def __init__(self, cfg: RolloutConfig, engine=None, ref_model=None, reward_fn=None):
        self.cfg = cfg
        self.engine = engine
        self.ref_model = ref_model
        self.reward_fn = reward_fn

    def generate(self, prompts):
        params = SamplingParams(temperature=self.cfg.temperature, max_tokens=self.cfg.max_new_tokens, logprobs=0)
        outs = self.engine.generate(prompts, params)
        ids = [np.asarray(o.outputs[0].token_ids) for o in outs]
        lps = [np.asarray([next(iter(d.values())).logprob for d in o.outputs[0].logprobs]) for o in outs]
        refs = [self.ref_model.score(p, i) for p, i in zip(prompts, ids)]
        scores = [self.reward_fn(p, i) for p, i in zip(prompts, ids)]
        return self.make_experience(ids, lps, refs, scores)

    def make_experience(self, ids, engine_lps, ref_lps, scores):
        rewards = []
        for lp, ref, score in zip(engine_lps, ref_lps, scores):
            log_ratio = np.clip(lp - ref, -20.0, 20.0)
            # error: KL004
            kl = np.expm1(-log_ratio) + log_ratio
            r = -self.cfg.init_kl_coef * kl
            r[-1] += score
            rewards.append(r)
        return Experience(ids, engine_lps, rewards)


class PPOLearner:
    def __init__(self, actor=None, optimizer=None, clip_eps=0.2, max_len=1024):
        self.actor = actor
        self.optimizer = optimizer
        self.clip_eps = clip_eps
        self.max_len = max_len

    def collate(self, exp: Experience):
        B, T = len(exp.token_rewards), max(len(r) for r in exp.token_rewards)
        rewards = torch.zeros(B, T, dtype=torch.float64)
        old_lp = torch.zeros(B, T, dtype=torch.float64)
        mask = torch.zeros(B, T, dtype=torch.float64)
        for i, (r, lp) in enumerate(zip(exp.token_rewards, exp.engine_logprobs)):
            rewards[i, : len(r)] = torch.from_numpy(r)
            old_lp[i, : len(lp)] = torch.from_numpy(lp)
            mask[i, : len(r)] = 1.0
        return rewards, old_lp, mask

    def policy_loss(self, log_probs, exp: Experience):
        rewards, old_lp, mask = self.collate(exp)
        returns = torch.zeros_like(rewards)
        running = torch.zeros(rewards.shape[0], dtype=rewards.dtype)
        for t in reversed(range(rewards.shape[1])):
            running = rewards[:, t] + running
            returns[:, t] = running
        ratio = torch.exp(log_probs - old_lp)
        surr1 = ratio * returns
        surr2 = ratio.clamp(1 - self.clip_eps, 1 + self.clip_eps) * returns
        return -(torch.min(surr1, surr2) * mask).sum(-1).mean() / self.max_len

    def train_step(self, exp: Experience, input_ids, attention_mask):
        log_probs = self.actor(input_ids, attention_mask=attention_mask)
        loss = self.policy_loss(log_probs, exp)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.item()
