# Reviewer: SkyRL-gym-style agent loop. Each env.step is one action with an
# engine log-prob and a reference log-prob; the worker packs the episode into a
# Trajectory with a per-step KL reward -kl_coef * (lp - ref). The learner
# discounts the ENVIRONMENT rewards into returns-to-go but adds the KL reward
# afterwards, to its own step only: every step's score is weighted by its own
# log-ratio, not by the KL of the steps after it. Partial gradient of the
# sequence KL(pi||pi_ref).
# Verdict: bug, KL003, reported where the worker computes the KL reward.
from dataclasses import dataclass

import numpy as np
import torch

import gymnasium as gym
from skyrl_gym.envs import BaseTextEnv


@dataclass
class Trajectory:
    actions: np.ndarray
    logprobs: np.ndarray
    env_rewards: np.ndarray
    kl_rewards: np.ndarray


class AgentRolloutWorker:
    def __init__(self, policy_client=None, ref_client=None, kl_coef: float = 0.05):
        self.policy_client = policy_client
        self.ref_client = ref_client
        self.kl_coef = kl_coef

    def run_episode(self, env: BaseTextEnv):
        obs, _ = env.reset()
        steps, done = [], False
        while not done:
            action, lp = self.policy_client.act(obs)
            ref_lp = self.ref_client.logprob(obs, action)
            obs, reward, terminated, truncated, _ = env.step(action)
            done = terminated or truncated
            steps.append((action, lp, ref_lp, reward))
        return self.pack(steps)

    def pack(self, steps):
        actions = np.array([s[0] for s in steps])
        lps = np.array([s[1] for s in steps], dtype=np.float64)
        refs = np.array([s[2] for s in steps], dtype=np.float64)
        env_rewards = np.array([s[3] for s in steps], dtype=np.float64)
        # error: KL003
        kl_rewards = -self.kl_coef * (lps - refs)
        return Trajectory(actions, lps, env_rewards, kl_rewards)


class StepPGLearner:
    def __init__(self, policy=None, optimizer=None, gamma: float = 1.0):
        self.policy = policy
        self.optimizer = optimizer
        self.gamma = gamma

    def advantages(self, trajs):
        T = max(len(t.actions) for t in trajs)
        adv = torch.zeros(len(trajs), T, dtype=torch.float64)
        mask = torch.zeros(len(trajs), T, dtype=torch.float64)
        for i, tr in enumerate(trajs):
            env_r = torch.from_numpy(tr.env_rewards)
            ret, running = torch.zeros_like(env_r), 0.0
            for t in reversed(range(len(env_r))):
                running = env_r[t] + self.gamma * running
                ret[t] = running
            adv[i, : len(env_r)] = ret + torch.from_numpy(tr.kl_rewards)
            mask[i, : len(env_r)] = 1.0
        return adv, mask

    def loss(self, logprobs, trajs):
        adv, mask = self.advantages(trajs)
        return -(adv * logprobs * mask).sum(-1).mean()

    def update(self, trajs, obs_batch, action_batch):
        logprobs = self.policy.log_prob(obs_batch, action_batch)
        loss = self.loss(logprobs, trajs)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
