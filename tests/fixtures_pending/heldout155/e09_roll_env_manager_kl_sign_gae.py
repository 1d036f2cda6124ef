# Reviewer: ROLL-style environment manager. A gym-like loop steps a text env,
# one action per step, recording the engine log-prob, the reference log-prob
# and the critic value. The KL is written ref - lp (the negative log-ratio) and
# then SUBTRACTED from the env rewards, so the KL is added to the reward. The
# learner runs GAE (gamma = lambda = 1) on those rewards: the KL part of the
# gradient is +coef * grad KL(pi||pi_ref) of the sequence: a bonus.
# Verdict: bug, KL006, reported on the line that computes the estimate.
from dataclasses import dataclass

import numpy as np
import torch

from roll.pipeline.agentic.env_manager import BaseEnvManager
from roll.distributed.scheduler.protocol import DataProto


@dataclass
class StepBuffer:
    logprobs: np.ndarray
    values: np.ndarray
    rewards: np.ndarray


class TrajEnvManager:
    def __init__(self, env=None, actor_infer=None, reference=None, critic=None, kl_coef: float = 0.05):
        self.env, self.actor_infer, self.reference, self.critic = env, actor_infer, reference, critic
        self.kl_coef = kl_coef

    def run_rollout_loop(self):
        obs, _ = self.env.reset()
        lps, refs, values, env_rewards, done = [], [], [], [], False
        while not done:
            action, lp = self.actor_infer.generate(obs)
            refs.append(self.reference.logprob(obs, action))
            values.append(self.critic.value(obs))
            obs, r, terminated, truncated, _ = self.env.step(action)
            lps.append(lp)
            env_rewards.append(r)
            done = terminated or truncated
        return self.shape_rewards(np.array(lps), np.array(refs), np.array(values), np.array(env_rewards))

    def shape_rewards(self, lps, refs, values, env_rewards):
        # error: KL006
        kl = refs - lps
        rewards = env_rewards - self.kl_coef * kl
        return StepBuffer(lps, values, rewards)


class ActorCriticLearner:
    def __init__(self, actor=None, optimizer=None, gamma: float = 1.0, lam: float = 1.0, clip: float = 0.2):
        self.actor, self.optimizer = actor, optimizer
        self.gamma, self.lam, self.clip = gamma, lam, clip

    def gae(self, buf: StepBuffer):
        r, v = torch.from_numpy(buf.rewards), torch.from_numpy(buf.values)
        adv, last = torch.zeros_like(r), 0.0
        for t in reversed(range(len(r))):
            nxt = v[t + 1] if t + 1 < len(r) else 0.0
            delta = r[t] + self.gamma * nxt - v[t]
            last = delta + self.gamma * self.lam * last
            adv[t] = last
        return adv

    def actor_loss(self, logprobs, buffers):
        losses = []
        for lp, buf in zip(logprobs, buffers):
            adv = self.gae(buf)
            ratio = torch.exp(lp - torch.from_numpy(buf.logprobs))
            surr = torch.min(ratio * adv, ratio.clamp(1 - self.clip, 1 + self.clip) * adv)
            losses.append(-surr.sum())
        return torch.stack(losses).mean()

    def train_step(self, batch: DataProto, buffers):
        logprobs = self.actor.compute_log_probs(batch)
        loss = self.actor_loss(logprobs, buffers)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
