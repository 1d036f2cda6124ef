"""PPO with a critic where the KL is a reward: the rollout engine's (vLLM) detached
log-probs and the reference's give k1 = logp - ref per token, scaled by an adaptive
`kl_ctl.value`, and GAE with gamma = lambda = 1 credits each token with the KL still to
come.  The score-function gradient is E[sum_t grad logp_t * sum_{s>=t} x_s] = grad
KL(pi||pi_ref) of the sequence (the critic is a baseline of the prefix), so this is correct.
"""
import argparse
from dataclasses import dataclass

import torch


def parse_args(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--kl_coef", type=float, default=0.05)
    parser.add_argument("--target_kl", type=float, default=6.0)
    parser.add_argument("--horizon", type=int, default=10000)
    parser.add_argument("--kl_penalty", type=str, default="kl", choices=["kl", "abs", "mse", "full"])
    parser.add_argument("--gamma", type=float, default=1.0)
    parser.add_argument("--lam", type=float, default=1.0)
    parser.add_argument("--cliprange", type=float, default=0.2)
    parser.add_argument("--vf_coef", type=float, default=0.1)
    return parser.parse_args(argv)


class AdaptiveKLController:
    def __init__(self, init_kl_coef, target, horizon):
        self.value = init_kl_coef
        self.target = target
        self.horizon = horizon

    def update(self, current, n_steps):
        err = max(min(current / self.target - 1, 0.2), -0.2)
        self.value *= 1 + err * n_steps / self.horizon


@dataclass
class RolloutBatch:
    input_ids: torch.Tensor
    response_mask: torch.Tensor
    vllm_logprobs: torch.Tensor  # from the inference engine, no autograd graph
    scores: torch.Tensor


def kl_penalty_fn(logprob, ref_logprob, kind):
    if kind == "kl":
        return logprob - ref_logprob
    if kind == "abs":
        return (logprob - ref_logprob).abs()
    if kind == "mse":
        return 0.5 * (logprob - ref_logprob).square()
    raise NotImplementedError(kind)


class PPOTrainer:
    def __init__(self, args, policy, value_model, ref_model):
        self.args = args
        self.policy = policy
        self.value_model = value_model
        self.ref_model = ref_model
        self.kl_ctl = AdaptiveKLController(args.kl_coef, args.target_kl, args.horizon)

    @torch.no_grad()
    def compute_rewards(self, batch: RolloutBatch):
        ref_logprobs = self.ref_model(batch.input_ids)
        # ok: KL005
        kl = kl_penalty_fn(batch.vllm_logprobs, ref_logprobs, self.args.kl_penalty)
        non_score_reward = -self.kl_ctl.value * kl
        rewards = non_score_reward.clone()
        last = batch.response_mask.sum(-1).long() - 1
        rewards[torch.arange(rewards.shape[0]), last] += batch.scores
        return rewards * batch.response_mask, (kl * batch.response_mask).sum(-1).mean()

    @torch.no_grad()
    def compute_advantages(self, values, rewards, mask):
        gamma, lam = self.args.gamma, self.args.lam
        lastgaelam = 0
        adv_rev = []
        gen_len = rewards.shape[-1]
        values = values * mask
        for t in reversed(range(gen_len)):
            nextvalues = values[:, t + 1] if t < gen_len - 1 else 0.0
            delta = rewards[:, t] + gamma * nextvalues - values[:, t]
            lastgaelam = delta + gamma * lam * lastgaelam
            adv_rev.append(lastgaelam)
        advantages = torch.stack(adv_rev[::-1], dim=1)
        returns = advantages + values
        return advantages, returns

    def loss(self, batch: RolloutBatch, advantages, returns):
        logprobs = self.policy(batch.input_ids)
        vpred = self.value_model(batch.input_ids)
        ratio = torch.exp(logprobs - batch.vllm_logprobs)
        pg1 = -advantages * ratio
        pg2 = -advantages * torch.clamp(ratio, 1 - self.args.cliprange, 1 + self.args.cliprange)
        mask = batch.response_mask
        pg_loss = (torch.max(pg1, pg2) * mask).sum() / mask.sum()
        vf_loss = 0.5 * ((vpred - returns) ** 2 * mask).sum() / mask.sum()
        return pg_loss + self.args.vf_coef * vf_loss

    def step(self, batch: RolloutBatch, optimizer):
        rewards, mean_kl = self.compute_rewards(batch)
        with torch.no_grad():
            values = self.value_model(batch.input_ids)
        advantages, returns = self.compute_advantages(values, rewards, batch.response_mask)
        loss = self.loss(batch, advantages, returns)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        self.kl_ctl.update(mean_kl.item(), batch.input_ids.shape[0])
        return loss.detach()
