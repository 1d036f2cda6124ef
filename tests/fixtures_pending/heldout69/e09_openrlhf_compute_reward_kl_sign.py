# Reviewer: OpenRLHF-style experience maker (KL in the reward, REINFORCE++
# returns). `compute_reward(...)` is given the action log-probs and the
# reference's and calls `compute_approx_kl(..., kl_estimator=...)` (from the
# dotted `--algo.kl.estimator` option, default "k1") itself, then builds the
# per-token reward `kl_coef * kl` and adds the outcome reward at the EOS token.
# `get_cumulative_returns` is a backward loop with gamma = 1. The actor loss is
# the clipped `-advantages * ratio` with advantages = returns.
# Verdict: BUG, KL006. The KL reward has the wrong sign: it is `+kl_coef * kl`,
# so the returns pay the policy for moving away from the reference; the loss's
# KL gradient is -kl_coef * grad KL(pi||pi_ref). The helper makes the estimate
# into rewards, so it is reported inside it, on the line that calls
# compute_approx_kl.
import argparse
from types import SimpleNamespace

import torch
from openrlhf.trainer.ppo_utils.experience_maker import Experience


def compute_approx_kl(log_probs, log_probs_base, kl_estimator: str = "k1"):
    log_ratio = log_probs.float() - log_probs_base.float()
    if kl_estimator == "k1":
        return log_ratio
    if kl_estimator == "k2":
        return 0.5 * log_ratio.pow(2)
    if kl_estimator == "k3":
        return torch.expm1(-log_ratio) + log_ratio
    raise ValueError(f"unsupported kl estimator: {kl_estimator}")


def compute_reward(r, kl_coef, action_log_probs, base_action_log_probs, action_mask, kl_estimator="k1"):
    # error: KL006
    kl = compute_approx_kl(action_log_probs, base_action_log_probs, kl_estimator=kl_estimator)
    kl = kl * action_mask
    kl_reward = kl_coef * kl
    eos_indices = action_mask.size(1) - 1 - action_mask.long().fliplr().argmax(dim=1, keepdim=True)
    last_reward = torch.zeros_like(kl).scatter_(dim=1, index=eos_indices, src=r.unsqueeze(1).to(kl.dtype))
    return last_reward + kl_reward, kl


def get_cumulative_returns(rewards, action_mask, gamma: float = 1.0):
    returns = torch.zeros_like(rewards)
    running = torch.zeros(rewards.size(0), dtype=rewards.dtype, device=rewards.device)
    rewards = rewards * action_mask
    for t in reversed(range(rewards.size(1))):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
    return returns


def nest_args(flat):
    root = SimpleNamespace()
    for key, value in vars(flat).items():
        node = root
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.__dict__.setdefault(p, SimpleNamespace())
        setattr(node, leaf, value)
    return root


def get_args(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--algo.kl.estimator", type=str, default="k1", choices=["k1", "k2", "k3"])
    parser.add_argument("--algo.kl.init_coef", type=float, default=0.01)
    parser.add_argument("--algo.gamma", type=float, default=1.0)
    parser.add_argument("--actor.eps_clip", type=float, default=0.2)
    return nest_args(parser.parse_args(argv))


@torch.no_grad()
def make_experience(args, sequences, action_log_probs, base_action_log_probs, action_mask, r) -> Experience:
    rewards, kl = compute_reward(r, args.algo.kl.init_coef, action_log_probs, base_action_log_probs, action_mask,
                                 kl_estimator=args.algo.kl.estimator)
    returns = get_cumulative_returns(rewards, action_mask, args.algo.gamma)
    info = {"kl": (kl.sum(-1) / action_mask.sum(-1)).mean(), "reward": r.mean()}
    return Experience(sequences=sequences, action_log_probs=action_log_probs, advantages=returns,
                      returns=returns, action_mask=action_mask, info=info)


def policy_loss(args, log_probs, old_log_probs, advantages, action_mask):
    ratio = (log_probs - old_log_probs).exp()
    surr1 = ratio * advantages
    surr2 = ratio.clamp(1 - args.actor.eps_clip, 1 + args.actor.eps_clip) * advantages
    return (-torch.min(surr1, surr2) * action_mask).sum(-1).mean()
