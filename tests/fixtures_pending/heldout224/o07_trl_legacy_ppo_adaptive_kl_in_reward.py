# Reviewer: TRL legacy PPOTrainer-style (trl <= 0.11, AutoModelForCausalLMWithValueHead),
# the same skeleton as e07. Default PPOConfig: kl_in_reward=True, adap_kl_ctrl=True with
# init_kl_coef=0.2, kl_penalty="kl", gamma = lam = 1. compute_rewards (no_grad, rollout
# log-probs) puts -kl_ctl.value * k1 in every token's reward and the score at the last token;
# GAE with gamma = lam = 1 credits the KL as a reward-to-go, so the KL part of the PPO
# gradient is kl_ctl.value * grad KL(pi||pi_ref). In loss(), the mean KL taken with .item()
# only feeds the adaptive controller and the stats; it is not added to the loss under the
# default. The value loss fits returns that hold the detached KL and trains the value head.
# Verdict: correct. The kl_mean = ... line, the in-reward KL and the value loss stay silent.
from dataclasses import dataclass

import torch

from trl import AutoModelForCausalLMWithValueHead  # noqa: F401
from trl.core import clip_by_value, entropy_from_logits  # noqa: F401


@dataclass
class PPOConfig:
    init_kl_coef: float = 0.2
    adap_kl_ctrl: bool = True
    target: float = 6.0
    horizon: float = 10000
    kl_penalty: str = "kl"
    kl_in_reward: bool = True
    gamma: float = 1.0
    lam: float = 1.0
    cliprange: float = 0.2
    cliprange_value: float = 0.2
    vf_coef: float = 0.1
    whiten_advantages: bool = False


class AdaptiveKLController:
    def __init__(self, init_kl_coef, target, horizon):
        self.value, self.target, self.horizon = init_kl_coef, target, horizon

    def update(self, current, n_steps):
        proportional_error = min(max(current / self.target - 1, -0.2), 0.2)
        self.value *= 1 + proportional_error * n_steps / self.horizon


class FixedKLController:
    def __init__(self, kl_coef):
        self.value = kl_coef

    def update(self, current, n_steps):
        pass


def masked_mean(values, mask):
    return (values * mask).sum() / mask.sum()


def masked_whiten(values, mask, shift_mean=True):
    mean, var = masked_mean(values, mask), masked_mean((values - masked_mean(values, mask)) ** 2, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    return whitened if shift_mean else whitened + mean


class PPOTrainer:
    def __init__(self, config: PPOConfig = None):
        self.config = config or PPOConfig()
        c = self.config
        self.kl_ctl = AdaptiveKLController(c.init_kl_coef, c.target, c.horizon) if c.adap_kl_ctrl else FixedKLController(c.init_kl_coef)

    def _kl_penalty(self, logprob, ref_logprob):
        if self.config.kl_penalty == "kl":
            return logprob - ref_logprob
        if self.config.kl_penalty == "abs":
            return (logprob - ref_logprob).abs()
        if self.config.kl_penalty == "mse":
            return 0.5 * (logprob - ref_logprob).square()
        raise NotImplementedError(self.config.kl_penalty)

    @torch.no_grad()
    def compute_rewards(self, scores, logprobs, ref_logprobs, masks):
        rewards = torch.zeros_like(logprobs)
        if self.config.kl_in_reward:
            # ok: KL001
            rewards = -self.kl_ctl.value * self._kl_penalty(logprobs, ref_logprobs)
        last = masks.sum(-1).long() - 1
        rewards[torch.arange(rewards.size(0)), last] += scores
        return rewards * masks

    @torch.no_grad()
    def compute_advantages(self, values, rewards, mask):
        lastgaelam = 0
        advantages_reversed = []
        gen_len = rewards.shape[-1]
        values, rewards = values * mask, rewards * mask
        for t in reversed(range(gen_len)):
            nextvalues = values[:, t + 1] if t < gen_len - 1 else 0.0
            delta = rewards[:, t] + self.config.gamma * nextvalues - values[:, t]
            lastgaelam = delta + self.config.gamma * self.config.lam * lastgaelam
            advantages_reversed.append(lastgaelam)
        advantages = torch.stack(advantages_reversed[::-1]).transpose(0, 1)
        returns = advantages + values
        if self.config.whiten_advantages:
            advantages = masked_whiten(advantages, mask)
        return values, advantages.detach(), returns

    def loss(self, old_logprobs, values, vpreds, logprobs, ref_logprobs, mask, advantages, returns):
        c = self.config
        vpredclipped = torch.clamp(vpreds, values - c.cliprange_value, values + c.cliprange_value)
        # ok: KL005
        vf_losses = torch.max((vpreds - returns) ** 2, (vpredclipped - returns) ** 2)
        vf_loss = 0.5 * (vf_losses * mask).sum(-1).mean()
        ratio = torch.exp(logprobs - old_logprobs)
        pg_losses = -advantages * ratio
        pg_losses2 = -advantages * torch.clamp(ratio, 1.0 - c.cliprange, 1.0 + c.cliprange)
        pg_loss = (torch.max(pg_losses, pg_losses2) * mask).sum(-1).mean()
        loss = pg_loss + c.vf_coef * vf_loss
        # ok: KL005
        kl_mean = masked_mean(self._kl_penalty(logprobs, ref_logprobs), mask).item()
        if not c.kl_in_reward:
            loss = loss + self.kl_ctl.value * kl_mean
        self.kl_ctl.update(kl_mean, logprobs.shape[0])
        stats = {"loss/policy": pg_loss.item(), "loss/value": vf_loss.item(), "objective/kl": kl_mean}
        return loss, stats

    def step(self, scores, logprobs, old_logprobs, ref_logprobs, values, vpreds, masks):
        rewards = self.compute_rewards(scores, old_logprobs, ref_logprobs, masks)
        values, advantages, returns = self.compute_advantages(values, rewards, masks)
        return self.loss(old_logprobs, values, vpreds, logprobs, ref_logprobs, masks, advantages, returns)
