# Reviewer: AReaL-style REINFORCE step. KLShapedReward wraps the reward
# function and a RefKLEstimator and forwards unknown attributes to them with
# `__getattr__`, so `self.kl(...)` inside `token_rewards` resolves to
# RefKLEstimator.kl. Its class attribute `kl_type` defaults to "low_var_kl":
# the k3 estimate, computed under no_grad and subtracted from the per-token
# rewards; `compute_returns` turns the rewards into reward-to-go returns
# (gamma = 1) that weight logp in the policy-gradient loss. k3 as a reward
# gives grad KL(pi||pi_ref) - grad KL(pi_ref||pi) (token level), not the KL
# gradient: the penalty barely acts near the reference.
# Verdict: bug, KL004, reported inside `token_rewards` (the helper that makes
# the estimate into rewards) on its line that calls the estimator.
import torch

from areal.api.cli_args import PPOActorConfig
from areal.utils.data import masked_normalization


class RefKLEstimator:
    kl_type: str = "low_var_kl"

    def __init__(self, ref_engine=None):
        self.ref_engine = ref_engine

    def kl(self, logprobs, ref_logprobs):
        log_ratio = (logprobs - ref_logprobs).float()
        if self.kl_type == "k1":
            # ok: KL001
            return log_ratio
        if self.kl_type == "low_var_kl":
            return torch.exp(-log_ratio) + log_ratio - 1
        raise ValueError(self.kl_type)


class KLShapedReward:
    """Reward function with a KL penalty; other attributes come from the wrapped objects."""

    def __init__(self, reward_fn, estimator: RefKLEstimator, kl_ctl: float = 0.05):
        self._reward_fn = reward_fn
        self._estimator = estimator
        self.kl_ctl = kl_ctl

    def __getattr__(self, name):
        for inner in (self.__dict__.get("_estimator"), self.__dict__.get("_reward_fn")):
            if inner is not None and hasattr(inner, name):
                return getattr(inner, name)
        raise AttributeError(name)

    @torch.no_grad()
    def token_rewards(self, scores, old_logprobs, ref_logprobs, loss_mask):
        # error: KL004
        kl = self.kl(old_logprobs, ref_logprobs)
        rewards = -self.kl_ctl * kl * loss_mask
        last = loss_mask.sum(-1).long() - 1
        rewards[torch.arange(rewards.size(0)), last] += scores
        return rewards


@torch.no_grad()
def compute_returns(rewards, loss_mask, gamma: float = 1.0):
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.size(1))):
        running = rewards[:, t] + gamma * running * loss_mask[:, t]
        returns[:, t] = running
    return returns * loss_mask


def reinforce_loss(logprobs, old_logprobs, returns, loss_mask, eps_clip=0.2, max_len=1024):
    ratio = torch.exp(logprobs - old_logprobs)
    pg1 = -returns * ratio
    pg2 = -returns * ratio.clamp(1 - eps_clip, 1 + eps_clip)
    return (torch.max(pg1, pg2) * loss_mask).sum(-1).mean() / max_len


def train_step(actor, batch, shaper: KLShapedReward, cfg: PPOActorConfig = None):
    rewards = shaper.token_rewards(batch["scores"], batch["logprobs"], batch["ref_logprobs"], batch["loss_mask"])
    returns = compute_returns(rewards, batch["loss_mask"])
    logprobs = actor.compute_logp(batch)
    loss = reinforce_loss(logprobs, batch["logprobs"], returns, batch["loss_mask"])
    loss.backward()
    return {"loss": loss.item(), "kl_type": shaper.kl_type}
