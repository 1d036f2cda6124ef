"""slime / AReaL-style actor loss where the KL-loss branch pairs the *rollout engine's*
log-probs (returned by sglang with each sample, plain floats turned into a tensor) with
the reference's.  Those log-probs carry no autograd graph, so the k3 term added to the
loss is a constant: its gradient is exactly zero and the "regulariser" does nothing
(KL005, at the helper call).  The trainer's own `log_probs` only feed the PPO ratio.
"""
import argparse
from dataclasses import dataclass, field
from typing import List

import torch


@dataclass
class Sample:
    tokens: List[int]
    response_length: int
    rollout_log_probs: List[float] = field(default_factory=list)  # meta_info["output_token_logprobs"]
    reward: float = 0.0


def add_args(parser: argparse.ArgumentParser):
    parser.add_argument("--use-kl-loss", action="store_true", default=True)
    parser.add_argument("--kl-loss-coef", type=float, default=0.01)
    parser.add_argument("--kl-loss-type", type=str, default="low_var_kl", choices=["k1", "k2", "k3", "low_var_kl"])
    parser.add_argument("--eps-clip", type=float, default=0.2)
    return parser


def compute_approx_kl(log_probs, log_probs_base, kl_loss_type):
    log_ratio = log_probs - log_probs_base
    if kl_loss_type == "k1":
        return log_ratio
    if kl_loss_type == "k2":
        return 0.5 * log_ratio**2
    if kl_loss_type in ("k3", "low_var_kl"):
        return torch.exp(-log_ratio) - 1 + log_ratio
    raise ValueError(kl_loss_type)


def collate(samples: List[Sample]):
    log_probs_actor = torch.tensor([s.rollout_log_probs for s in samples], dtype=torch.float32)
    rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
    mask = torch.ones_like(log_probs_actor)
    return {"log_probs_actor": log_probs_actor, "rewards": rewards, "loss_mask": mask}


def policy_loss_function(args, batch, log_probs, ref_log_probs, advantages):
    mask = batch["loss_mask"]
    ppo_kl = batch["log_probs_actor"] - log_probs
    ratio = (-ppo_kl).exp()
    pg = torch.max(-ratio * advantages, -ratio.clamp(1 - args.eps_clip, 1 + args.eps_clip) * advantages)
    loss = (pg * mask).sum() / mask.sum()
    if args.use_kl_loss:
        # error: KL005
        kl = compute_approx_kl(batch["log_probs_actor"], ref_log_probs, kl_loss_type=args.kl_loss_type)
        kl_loss = (kl * mask).sum() / mask.sum()
        loss = loss + args.kl_loss_coef * kl_loss
    return loss


def train_step(args, model, ref_model, samples, optimizer):
    batch = collate(samples)
    tokens = torch.tensor([s.tokens for s in samples])
    log_probs = model(tokens).logits.log_softmax(-1).gather(-1, tokens[..., None]).squeeze(-1)
    with torch.no_grad():
        ref_log_probs = ref_model(tokens).logits.log_softmax(-1).gather(-1, tokens[..., None]).squeeze(-1)
    adv = (batch["rewards"] - batch["rewards"].mean())[:, None]
    loss = policy_loss_function(args, batch, log_probs, ref_log_probs, adv)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
