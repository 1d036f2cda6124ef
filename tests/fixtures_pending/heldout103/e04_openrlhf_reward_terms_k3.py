# Reviewer: OpenRLHF-style REINFORCE experience maker whose per-token rewards
# are composed from `reward_terms` in the config: each shaping function
# receives the experience batch and returns a [B, T] tensor, and the tensors
# are summed into `rewards`, turned into returns by a reverse cumulative sum,
# and used as the weights of the policy gradient. The "kl" shaping term
# computes the "low variance" k3 estimate under torch.no_grad().
# Verdict: bug (KL004). k3 used as a reward (a detached score-function weight)
# has expected gradient grad KL(pi||pi_ref) minus the token-level gradient of
# KL(pi_ref||pi): biased, and nearly zero near the reference. k1 belongs here.
from dataclasses import dataclass, field
from typing import Dict, List

import torch

from openrlhf.models.utils import masked_mean  # noqa: F401


@dataclass
class ShapingConfig:
    reward_terms: List[str] = field(default_factory=lambda: ["score", "kl", "overlong"])
    init_kl_coef: float = 0.02
    max_new_tokens: int = 1024
    overlong_penalty: float = 0.0


def score_term(exp, cfg):
    rewards = torch.zeros_like(exp["action_mask"], dtype=torch.float32)
    last = exp["action_mask"].sum(-1).long() - 1
    rewards[torch.arange(rewards.shape[0]), last] = exp["score"].float()
    return rewards


@torch.no_grad()
def kl_term(exp, cfg):
    log_ratio = exp["action_log_probs"] - exp["base_action_log_probs"]
    # error: KL004
    kl = (-log_ratio).exp() - 1 + log_ratio
    return -cfg.init_kl_coef * kl * exp["action_mask"]


def overlong_term(exp, cfg):
    lengths = exp["action_mask"].sum(-1)
    pen = torch.zeros_like(exp["action_mask"], dtype=torch.float32)
    too_long = lengths >= cfg.max_new_tokens
    pen[too_long, -1] = -cfg.overlong_penalty
    return pen


REWARD_TERMS = {"score": score_term, "kl": kl_term, "overlong": overlong_term}


@torch.no_grad()
def build_returns(exp, cfg: ShapingConfig) -> Dict[str, torch.Tensor]:
    parts = {name: REWARD_TERMS[name](exp, cfg) for name in cfg.reward_terms}
    rewards = torch.stack(list(parts.values())).sum(0) * exp["action_mask"]
    returns = rewards.flip(-1).cumsum(-1).flip(-1)
    info = {f"reward/{k}": (v.sum(-1)).mean().item() for k, v in parts.items()}
    return {"returns": returns, "info": info}


def policy_loss(action_log_probs, old_action_log_probs, returns, action_mask, clip_eps=0.2):
    ratio = (action_log_probs - old_action_log_probs).exp()
    surr1 = ratio * returns
    surr2 = ratio.clamp(1 - clip_eps, 1 + clip_eps) * returns
    loss = -torch.min(surr1, surr2)
    return (loss * action_mask).sum(-1).mean()


class ReinforceTrainer:
    def __init__(self, actor, optimizer, cfg: ShapingConfig):
        self.actor, self.optimizer, self.cfg = actor, optimizer, cfg

    def training_step(self, exp):
        out = build_returns(exp, self.cfg)
        action_log_probs = self.actor(exp["sequences"], exp["num_actions"], exp["attention_mask"])
        loss = policy_loss(action_log_probs, exp["action_log_probs"], out["returns"], exp["action_mask"])
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {"policy_loss": loss.item(), **out["info"]}
