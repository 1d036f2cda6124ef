# Reviewer: ROLL-style token-level KL reward. PPOConfig.__post_init__ lower-cases kl_penalty
# and maps "k1" -> "kl", "k2" -> "mse", "k3" -> "low_var_kl"; the default "K1" selects the
# lambda `kl`, whose signature is (logprob, ref_logprob). compute_token_reward calls it
# positionally as fn(ref_log_probs, old_log_probs): the arguments are swapped, so kld is
# ref - logp = -k1, and `scores - kl_coef * kld` ADDS the log-ratio to the rewards. With
# REINFORCE returns the KL part of the gradient is -kl_coef * grad KL(pi||pi_ref): a bonus.
# Verdict: bug, KL006, reported inside compute_token_reward on `kld = kl_fn(...)` (the estimate).
from dataclasses import dataclass

import torch

from roll.utils.functionals import masked_mean  # noqa: F401
from roll.pipeline.rlvr.rlvr_config import RLVRConfig  # noqa: F401

KL_PENALTY_FNS = {
    "kl": lambda logprob, ref_logprob: logprob - ref_logprob,
    "abs": lambda logprob, ref_logprob: (logprob - ref_logprob).abs(),
    "mse": lambda logprob, ref_logprob: 0.5 * (logprob - ref_logprob).square(),
    "low_var_kl": lambda logprob, ref_logprob: torch.expm1(ref_logprob - logprob) - (ref_logprob - logprob),
}
_LEGACY_NAMES = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}


@dataclass
class PPOConfig:
    add_token_level_kl: bool = True
    init_kl_coef: float = 0.05
    kl_penalty: str = "K1"
    pg_clip: float = 0.2

    def __post_init__(self):
        name = self.kl_penalty.strip().lower()
        self.kl_penalty = _LEGACY_NAMES.get(name, name)
        if self.kl_penalty not in KL_PENALTY_FNS:
            raise ValueError(f"unsupported kl_penalty {self.kl_penalty}")


@torch.no_grad()
def compute_token_reward(data: dict, config: PPOConfig, kl_coef: float):
    mask = data["response_mask"]
    kl_fn = KL_PENALTY_FNS[config.kl_penalty]
    # error: KL006
    kld = kl_fn(data["ref_log_probs"], data["old_log_probs"])
    token_level_rewards = data["token_level_scores"] - kl_coef * kld * mask
    data["token_level_rewards"] = token_level_rewards
    data["kl"] = (kld * mask).sum(-1)
    return data


@torch.no_grad()
def compute_reinforce_return(data: dict):
    rewards = data["token_level_rewards"] * data["response_mask"]
    data["advantages"] = rewards.flip(-1).cumsum(-1).flip(-1) * data["response_mask"]
    return data


class ActorWorker:
    def __init__(self, config: PPOConfig):
        self.config = config

    def loss_func(self, data: dict, log_probs):
        mask = data["response_mask"]
        ratio = (log_probs - data["old_log_probs"]).exp()
        adv = data["advantages"]
        surr1 = ratio * adv
        surr2 = ratio.clamp(1 - self.config.pg_clip, 1 + self.config.pg_clip) * adv
        pg_loss = (-torch.min(surr1, surr2) * mask).sum(-1).mean()
        return pg_loss


def rlvr_step(config: PPOConfig, data: dict, log_probs):
    data["old_log_probs"] = log_probs.detach()
    if config.add_token_level_kl:
        data = compute_token_reward(data, config, config.init_kl_coef)
    else:
        data["token_level_rewards"] = data["token_level_scores"]
    data = compute_reinforce_return(data)
    return ActorWorker(config).loss_func(data, log_probs)
