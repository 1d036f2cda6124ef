# Reviewer: TRL PPOTrainer-style (the 0.12+ rewrite with a separate value model) rollout and
# PPO minibatch loss. Default PPOConfig: kl_estimator="k1", kl_coef=0.05, gamma = lam = 1,
# whiten_rewards=False, whiten_advantages=False. The rollout computes kl = -logr = logprob -
# ref_logprob and non_score_reward = -kl_coef * kl (already a penalty), but the rewards are
# then formed as score_reward - non_score_reward: the minus sign is applied twice, so each
# token gets +kl_coef * kl, a KL bonus. GAE with gamma = lam = 1 credits it as a reward-to-go,
# so the minimised PPO loss has the expected gradient -c * grad KL(pi||pi_ref), c > 0: training
# moves away from the reference. The value loss fits those returns and trains the critic only.
# Verdict: bug, KL006, reported on the line that computes the estimate (kl = ...), the one
# line the sign spread over several lines passes through.
from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: F401

from accelerate import Accelerator  # noqa: F401
from transformers import PreTrainedModel  # noqa: F401


@dataclass
class PPOConfig:
    kl_coef: float = 0.05
    kl_estimator: str = "k1"
    cliprange: float = 0.2
    cliprange_value: float = 0.2
    vf_coef: float = 0.1
    gamma: float = 1.0
    lam: float = 1.0
    whiten_rewards: bool = False
    whiten_advantages: bool = False
    response_length: int = 53


def masked_mean(values, mask, axis=None):
    return (values * mask).sum(axis=axis) / mask.sum(axis=axis)


def masked_whiten(values, mask, shift_mean=True):
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    return whitened if shift_mean else whitened + mean


class PPOStep:
    def __init__(self, args: PPOConfig = None):
        self.args = args or PPOConfig()

    @torch.no_grad()
    def rollout_advantages(self, logprobs, ref_logprobs, values, scores, padding_mask):
        args = self.args
        logr = ref_logprobs - logprobs
        # error: KL006
        kl = -logr if args.kl_estimator == "k1" else (logr.exp() - 1) - logr
        non_score_reward = -args.kl_coef * kl
        sequence_lengths = (~padding_mask).sum(-1) - 1
        score_reward = torch.zeros_like(logprobs)
        score_reward[torch.arange(score_reward.size(0)), sequence_lengths] = scores
        rewards = score_reward - non_score_reward
        rewards = torch.masked_fill(rewards, padding_mask, 0)
        if args.whiten_rewards:
            rewards = masked_whiten(rewards, mask=~padding_mask, shift_mean=False)
            rewards = torch.masked_fill(rewards, padding_mask, 0)
        values = torch.masked_fill(values, padding_mask, 0)

        lastgaelam = 0
        advantages_reversed = []
        gen_length = logprobs.shape[1]
        for t in reversed(range(gen_length)):
            nextvalues = values[:, t + 1] if t < gen_length - 1 else 0.0
            delta = rewards[:, t] + args.gamma * nextvalues - values[:, t]
            lastgaelam = delta + args.gamma * args.lam * lastgaelam
            advantages_reversed.append(lastgaelam)
        advantages = torch.stack(advantages_reversed[::-1], axis=1)
        returns = advantages + values
        if args.whiten_advantages:
            advantages = masked_whiten(advantages, ~padding_mask)
        advantages = torch.masked_fill(advantages, padding_mask, 0)
        stats = {"objective/kl": (kl.masked_fill(padding_mask, 0)).sum(1).mean().item(),
                 "objective/non_score_reward": non_score_reward.masked_fill(padding_mask, 0).sum(1).mean().item()}
        return advantages, returns, stats

    def minibatch_loss(self, new_logprobs, vpred, mb_logprobs, mb_values, mb_advantage, mb_return, padding_mask):
        args = self.args
        keep = (~padding_mask).float()
        vpredclipped = torch.clamp(vpred, mb_values - args.cliprange_value, mb_values + args.cliprange_value)
        # ok: KL005
        vf_loss_max = torch.max(torch.square(vpred - mb_return), torch.square(vpredclipped - mb_return))
        vf_loss = 0.5 * (vf_loss_max * keep).sum(1).mean() / args.response_length
        ratio = torch.exp(new_logprobs - mb_logprobs)
        pg_losses = -mb_advantage * ratio
        pg_losses2 = -mb_advantage * torch.clamp(ratio, 1.0 - args.cliprange, 1.0 + args.cliprange)
        pg_loss = (torch.max(pg_losses, pg_losses2) * keep).sum(1).mean() / args.response_length
        loss = pg_loss + args.vf_coef * vf_loss
        return loss, {"loss/policy_avg": pg_loss.item(), "loss/value_avg": vf_loss.item()}
