"""An OpenRLHF-style Ray PPO actor with dotted command-line options (``--algo.kl.estimator``).

Options are parsed flat by argparse and then nested (``args.algo.kl.estimator``); some
older call sites still read the flat attribute with ``getattr``. The KL estimator defaults
to k3 here (the GRPO recipe). Rollouts are consumed once, right after generation.

- k3 as a KL loss, aggregated over the batch's tokens: KL002 (gradient of KL(pi_ref||pi));
- the "unbiased gradient" switch keeps k3's value but gives each token the gradient
  ``logr_t grad logp_t`` (k2's): right per token, partial for the response (KL003);
- k1 in the reward, credited by cumulative returns (gamma = 1): quiet.

Fixture: parsed by the tests, never executed.
"""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import torch


def nest_dotted(args: argparse.Namespace) -> SimpleNamespace:
    """Turn {"algo.kl.estimator": "k3"} into args.algo.kl.estimator == "k3"."""
    root = SimpleNamespace()
    for key, value in vars(args).items():
        node = root
        *parents, leaf = key.split(".")
        for part in parents:
            if not hasattr(node, part):
                setattr(node, part, SimpleNamespace())
            node = getattr(node, part)
        setattr(node, leaf, value)
    return root


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("--algo.kl.use_loss", action="store_true", default=True)
    parser.add_argument("--algo.kl.init_coef", type=float, default=0.001)
    parser.add_argument("--algo.kl.estimator", type=str, default="k3", choices=["k1", "k2", "k3"])
    parser.add_argument("--algo.kl.unbiased_gradient", action="store_true", default=False)
    parser.add_argument("--algo.gamma", type=float, default=1.0)
    parser.add_argument("--actor.eps_clip", type=float, default=0.2)
    return parser


def compute_approx_kl(
    log_probs: torch.Tensor,
    log_probs_base: torch.Tensor,
    kl_estimator: str = "k1",
    unbiased_gradient: bool = False,
) -> torch.Tensor:
    log_ratio = log_probs.float() - log_probs_base.float()
    if kl_estimator == "k1":
        value = log_ratio
    elif kl_estimator == "k2":
        value = log_ratio**2 / 2.0
    elif kl_estimator == "k3":
        log_ratio = -log_ratio
        value = log_ratio.exp() - 1 - log_ratio
    else:
        raise ValueError(kl_estimator)
    value = value.clamp(min=-10, max=10)
    if not unbiased_gradient:
        return value
    surrogate = (log_probs.float() - log_probs_base.float()) ** 2 / 2.0
    return value.detach() + surrogate - surrogate.detach()


def aggregate_loss(values: torch.Tensor, mask: torch.Tensor, total_tokens: int | None = None, dp_size: int = 1, **_) -> torch.Tensor:
    total = total_tokens if total_tokens is not None else mask.sum()
    return (values * mask).sum() * dp_size / total


def policy_loss_fn(log_probs, old_log_probs, advantages, action_mask, eps_clip=0.2, **loss_batch_info):
    ratio = (log_probs - old_log_probs).exp()
    surr = torch.min(ratio * advantages, ratio.clamp(1 - eps_clip, 1 + eps_clip) * advantages)
    return aggregate_loss(-surr, action_mask, **loss_batch_info)


class PolicyRayActor:
    def __init__(self, args, actor, optimizer):
        self.args = nest_dotted(args)
        self.flat_args = args
        self.actor = actor
        self.optimizer = optimizer

    def training_step(self, experience, loss_batch_info: dict):
        action_log_probs = self.actor(experience.sequences, experience.action_mask.size(1))
        base_action_log_probs = experience.base_action_log_probs
        actor_loss = policy_loss_fn(
            action_log_probs, experience.action_log_probs, experience.advantages, experience.action_mask, **loss_batch_info
        )
        if self.args.algo.kl.use_loss:
            # error: KL002
            kl = compute_approx_kl(action_log_probs, base_action_log_probs, kl_estimator=self.args.algo.kl.estimator)
            kl_loss = aggregate_loss(kl, experience.action_mask, **loss_batch_info)
        else:
            kl_loss = 0
        loss = actor_loss + kl_loss * self.args.algo.kl.init_coef
        loss.backward()
        self.optimizer.step()
        return {"kl": float(kl_loss)}

    def training_step_flat(self, experience, loss_batch_info: dict):
        action_log_probs = self.actor(experience.sequences, experience.action_mask.size(1))
        estimator = getattr(self.flat_args, "algo.kl.estimator")
        actor_loss = policy_loss_fn(action_log_probs, experience.action_log_probs, experience.advantages, experience.action_mask)
        # error: KL002
        kl = compute_approx_kl(action_log_probs, experience.base_action_log_probs, kl_estimator=estimator)
        loss = actor_loss + 0.001 * aggregate_loss(kl, experience.action_mask, **loss_batch_info)
        loss.backward()
        self.optimizer.step()

    def training_step_unbiased(self, experience, loss_batch_info: dict):
        action_log_probs = self.actor(experience.sequences, experience.action_mask.size(1))
        actor_loss = policy_loss_fn(action_log_probs, experience.action_log_probs, experience.advantages, experience.action_mask)
        # error: KL003
        # ok: KL001, KL002
        kl = compute_approx_kl(action_log_probs, experience.base_action_log_probs, kl_estimator=self.args.algo.kl.estimator, unbiased_gradient=True)
        loss = actor_loss + self.args.algo.kl.init_coef * aggregate_loss(kl, experience.action_mask, **loss_batch_info)
        loss.backward()
        self.optimizer.step()


@torch.no_grad()
def make_experience_rewards(args, action_log_probs, base_action_log_probs, action_mask, scores):
    """KL in the reward: k1 per token, the score on the last token, cumulative returns."""
    # ok: KL001, KL002, KL003, KL004, KL005, KL006
    kl = compute_approx_kl(action_log_probs, base_action_log_probs, kl_estimator="k1")
    reward = -args.algo.kl.init_coef * kl * action_mask
    eos = action_mask.long().sum(dim=1) - 1
    reward[torch.arange(reward.size(0)), eos] += scores
    returns = torch.zeros_like(reward)
    running = torch.zeros_like(scores)
    for t in reversed(range(reward.size(1))):
        running = reward[:, t] + args.algo.gamma * running
        returns[:, t] = running
    return returns
