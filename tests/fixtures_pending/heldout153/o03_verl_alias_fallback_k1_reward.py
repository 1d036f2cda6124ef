# Reviewer: verl-style trainer, same skeleton as e03 (alias dict looked up without lower-casing,
# "kl" fallback). Here the default configuration puts the KL in the REWARD
# (use_kl_in_reward=True, use_kl_loss=False). algorithm.kl_penalty="K3" reads as k3, but the
# lookup falls back to "kl": apply_kl_penalty puts -kl_coef * k1 (detached) in the token rewards,
# and REINFORCE returns (reverse cumsum) credit them, the reward-to-go of the log-ratio: exactly
# kl_coef * grad KL(pi||pi_ref). A linter that trusts the "K3" spelling would call it KL004;
# the disabled KL-loss branch is not run by default.
# Verdict: correct. apply_kl_penalty's call and the disabled loss call stay silent.
from dataclasses import dataclass, field

import torch

from verl import DataProto
from verl.trainer.ppo.core_algos import agg_loss

KL_ALIASES = {
    "kl": "kl",
    "k1": "kl",
    "abs": "abs",
    "mse": "mse",
    "k2": "mse",
    "low_var_kl": "low_var_kl",
    "low-var-kl": "low_var_kl",
    "k3": "low_var_kl",
}


def canonical_kl_name(name: str) -> str:
    # unknown names fall back to the plain log-ratio, as the 0.2 configs did
    return KL_ALIASES.get(name, "kl")


def kl_penalty(logprob, ref_logprob, kl_penalty: str = "kl"):
    match canonical_kl_name(kl_penalty):
        case "kl":
            return logprob - ref_logprob
        case "abs":
            return (logprob - ref_logprob).abs()
        case "mse":
            return 0.5 * (logprob - ref_logprob).square()
        case "low_var_kl":
            kl = torch.clamp(ref_logprob - logprob, min=-20, max=20)
            return torch.exp(kl) - kl - 1
        case other:
            raise NotImplementedError(other)


@dataclass
class AlgoConfig:
    use_kl_in_reward: bool = True
    kl_penalty: str = "K3"
    kl_coef: float = 0.001


@dataclass
class ActorConfig:
    use_kl_loss: bool = False
    kl_loss_type: str = "K3"
    kl_loss_coef: float = 0.001
    clip_ratio: float = 0.2


@dataclass
class PPOConfig:
    algorithm: AlgoConfig = field(default_factory=AlgoConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)


def apply_kl_penalty(token_level_scores, old_log_prob, ref_log_prob, response_mask, kl_name, kl_coef):
    # ok: KL004
    kld = kl_penalty(old_log_prob, ref_log_prob, kl_penalty=kl_name)
    return token_level_scores - kl_coef * kld * response_mask


def compute_reinforce_returns(token_level_rewards, response_mask):
    returns = (token_level_rewards * response_mask).flip(-1).cumsum(-1).flip(-1)
    return returns * response_mask


class Actor:
    def __init__(self, config: ActorConfig):
        self.config = config

    def compute_policy_loss(self, log_prob, old_log_prob, ref_log_prob, advantages, response_mask):
        cfg = self.config
        ratio = torch.exp(log_prob - old_log_prob)
        pg_losses = -advantages * ratio
        pg_losses2 = -advantages * torch.clamp(ratio, 1 - cfg.clip_ratio, 1 + cfg.clip_ratio)
        policy_loss = (torch.maximum(pg_losses, pg_losses2) * response_mask).sum(-1).mean()
        if cfg.use_kl_loss:
            # ok: KL001
            kld = kl_penalty(log_prob, ref_log_prob, kl_penalty=cfg.kl_loss_type)
            kl_loss = (kld * response_mask).sum(-1).mean()
            policy_loss = policy_loss + cfg.kl_loss_coef * kl_loss
        return policy_loss


def train_step(config: PPOConfig, log_prob, ref_log_prob, token_level_scores, response_mask):
    old_log_prob = log_prob.detach()
    with torch.no_grad():
        rewards = token_level_scores
        if config.algorithm.use_kl_in_reward:
            rewards = apply_kl_penalty(
                rewards, old_log_prob, ref_log_prob, response_mask, config.algorithm.kl_penalty, config.algorithm.kl_coef
            )
        advantages = compute_reinforce_returns(rewards, response_mask)
    return Actor(config.actor).compute_policy_loss(log_prob, old_log_prob, ref_log_prob, advantages, response_mask)
