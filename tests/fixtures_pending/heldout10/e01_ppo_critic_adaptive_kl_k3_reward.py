"""OpenRLHF-style PPO with a critic: an adaptive controller (`kl_ctl.value`) scales a
per-token KL reward that GAE (gamma = lambda = 1) turns into advantages.  The
estimator is picked by `--kl_estimator`, whose default is "k3": k3 as a detached
reward credited by returns gives grad KL(pi||pi_ref) minus the token-level grad of
KL(pi_ref||pi), so the penalty barely acts near the reference (KL004).
"""
import argparse

import numpy as np
import torch


def get_args(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--init_kl_coef", type=float, default=0.01)
    p.add_argument("--kl_target", type=float, default=None)
    p.add_argument("--kl_horizon", type=int, default=10000)
    p.add_argument("--kl_estimator", type=str, default="k3", choices=["k1", "k2", "k3"])
    p.add_argument("--gamma", type=float, default=1.0)
    p.add_argument("--lambd", type=float, default=1.0)
    p.add_argument("--eps_clip", type=float, default=0.2)
    return p.parse_args(argv)


class AdaptiveKLController:
    def __init__(self, init_kl_coef, target, horizon):
        self.value = init_kl_coef
        self.target = target
        self.horizon = horizon

    def update(self, current, n_steps):
        proportional_error = np.clip(current / self.target - 1, -0.2, 0.2)
        self.value *= 1 + proportional_error * n_steps / self.horizon


class FixedKLController:
    def __init__(self, kl_coef):
        self.value = kl_coef

    def update(self, current, n_steps):
        pass


def compute_approx_kl(log_probs, log_probs_base, kl_estimator="k1"):
    log_ratio = log_probs.float() - log_probs_base.float()
    if kl_estimator == "k2":
        log_ratio = log_ratio**2 / 2.0
    if kl_estimator == "k3":
        log_ratio = -log_ratio
        log_ratio = log_ratio.exp() - 1 - log_ratio
    return log_ratio


def compute_reward(r, kl_coef, kl, action_mask):
    kl_reward = -kl_coef * kl * action_mask
    eos_indices = action_mask.size(1) - 1 - action_mask.long().fliplr().argmax(dim=1, keepdim=True)
    last_reward = torch.zeros_like(kl).scatter_(dim=1, index=eos_indices, src=r.unsqueeze(1).to(kl.dtype))
    return last_reward + kl_reward


def get_advantages_and_returns(values, rewards, action_mask, gamma, lambd):
    values = values * action_mask
    rewards = rewards * action_mask
    lastgaelam = 0
    advantages_reversed = []
    response_length = rewards.size(1)
    for t in reversed(range(response_length)):
        nextvalues = values[:, t + 1] if t < response_length - 1 else 0.0
        delta = rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam = delta + gamma * lambd * lastgaelam
        advantages_reversed.append(lastgaelam)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)
    returns = advantages + values
    return advantages.detach(), returns


class ExperienceMaker:
    def __init__(self, args, actor, critic, initial_model, reward_fn):
        self.args = args
        self.actor = actor
        self.critic = critic
        self.initial_model = initial_model
        self.reward_fn = reward_fn
        if args.kl_target:
            self.kl_ctl = AdaptiveKLController(args.init_kl_coef, args.kl_target, args.kl_horizon)
        else:
            self.kl_ctl = FixedKLController(args.init_kl_coef)

    @torch.no_grad()
    def make_experience(self, sequences, action_mask):
        action_log_probs = self.actor(sequences)
        base_action_log_probs = self.initial_model(sequences)
        value = self.critic(sequences)
        r = self.reward_fn(sequences)
        # error: KL004
        kl = compute_approx_kl(action_log_probs, base_action_log_probs, kl_estimator=self.args.kl_estimator)
        rewards = compute_reward(r, self.kl_ctl.value, kl, action_mask)
        advantages, returns = get_advantages_and_returns(value, rewards, action_mask, self.args.gamma, self.args.lambd)
        return {
            "sequences": sequences,
            "action_log_probs": action_log_probs,
            "advantages": advantages,
            "returns": returns,
            "action_mask": action_mask,
            "kl": (kl * action_mask).sum(-1) / action_mask.sum(-1),
        }


class PolicyLoss(torch.nn.Module):
    def __init__(self, clip_eps=0.2):
        super().__init__()
        self.clip_eps = clip_eps

    def forward(self, log_probs, old_log_probs, advantages, action_mask):
        ratio = (log_probs - old_log_probs).exp()
        surr1 = ratio * advantages
        surr2 = ratio.clamp(1 - self.clip_eps, 1 + self.clip_eps) * advantages
        loss = -torch.min(surr1, surr2)
        return ((loss * action_mask).sum(-1) / action_mask.sum(-1).clamp(min=1)).mean()


def train_step(actor, optimizer, experience, policy_loss_fn):
    log_probs = actor(experience["sequences"])
    loss = policy_loss_fn(log_probs, experience["action_log_probs"], experience["advantages"], experience["action_mask"])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()
