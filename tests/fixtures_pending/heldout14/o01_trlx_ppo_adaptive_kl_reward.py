"""trlX-style PPO: per-token KL penalty in the rewards, AdaptiveKLController.

``make_experience`` puts ``-kl_ctl.value * log_ratio`` on every response token
(the score on the last one) and stores ``PPORLElement``s; ``PPOConfig.loss`` is
the clipped PPO objective on GAE advantages (gamma = lam = 1 here, so the
advantage is the reward-to-go minus the value baseline).
"""

from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch
import torch.nn.functional as F


@dataclass
class PPORLElement:
    query_tensor: torch.Tensor
    response_tensor: torch.Tensor
    logprobs: torch.Tensor
    values: torch.Tensor
    rewards: torch.Tensor


class AdaptiveKLController:
    """Adaptive KL controller of Ziegler et al. (2019), https://arxiv.org/abs/1909.08593"""

    def __init__(self, init_kl_coef: float, target: float, horizon: int):
        self.value = init_kl_coef
        self.target = target
        self.horizon = horizon

    def update(self, current: float, n_steps: int):
        proportional_error = np.clip(current / self.target - 1, -0.2, 0.2)
        mult = 1 + proportional_error * n_steps / self.horizon
        self.value *= mult


def logprobs_of_labels(logits, labels):
    logprobs = F.log_softmax(logits, dim=-1)
    logprobs_labels = torch.gather(logprobs, dim=-1, index=labels.unsqueeze(-1))
    return logprobs_labels.squeeze(-1)


def whiten(xs, shift_mean=True):
    mean, var = torch.mean(xs), torch.var(xs, unbiased=False)
    whitened = (xs - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened += mean
    return whitened


@dataclass
class PPOConfig:
    ppo_epochs: int = 4
    init_kl_coef: float = 0.05
    target: Optional[float] = 6.0
    horizon: int = 10000
    gamma: float = 1.0
    lam: float = 1.0
    cliprange: float = 0.2
    cliprange_value: float = 0.2
    vf_coef: float = 1.0
    whiten_advantages: bool = False

    def get_advantages_and_returns(self, values, rewards, response_length, use_whitening=True):
        lastgaelam = 0
        advantages_reversed = []
        for t in reversed(range(response_length)):
            nextvalues = values[:, t + 1] if t < response_length - 1 else 0.0
            delta = rewards[:, t] + self.gamma * nextvalues - values[:, t]
            lastgaelam = delta + self.gamma * self.lam * lastgaelam
            advantages_reversed.append(lastgaelam)
        advantages = torch.stack(advantages_reversed[::-1], dim=1)
        returns = advantages + values
        if use_whitening:
            advantages = whiten(advantages)
        return advantages.detach(), returns

    def loss(self, logprobs, values, old_logprobs, old_values, advantages, returns, mask):
        values_clipped = torch.clamp(values, old_values - self.cliprange_value, old_values + self.cliprange_value)
        n = mask.sum()

        vf_loss1 = (values - returns) ** 2
        vf_loss2 = (values_clipped - returns) ** 2
        vf_loss = 0.5 * torch.sum(torch.max(vf_loss1, vf_loss2) * mask) / n

        log_ratio = (logprobs - old_logprobs) * mask
        ratio = torch.exp(log_ratio)
        # Unbiased KL-div estimates (`k3`). Ref: http://joschu.net/blog/kl-approx.html
        with torch.no_grad():
            # ok: KL002
            approx_kl = torch.mean((ratio - 1) - log_ratio)

        pg_loss1 = -advantages * ratio
        pg_loss2 = -advantages * torch.clamp(ratio, 1.0 - self.cliprange, 1.0 + self.cliprange)
        pg_loss = torch.sum(torch.max(pg_loss1, pg_loss2) * mask) / n

        loss = pg_loss + self.vf_coef * vf_loss
        stats = {"losses/total_loss": loss.item(), "policy/approx_kl": approx_kl.item()}
        return loss, stats


class AcceleratePPOTrainer:
    def __init__(self, model, ref_model, accelerator, optimizer, reward_fn, config: PPOConfig = PPOConfig()):
        self.model = model  # returns (logits, values) from a value head on the LM
        self.ref_model = ref_model
        self.accelerator = accelerator
        self.opt = optimizer
        self.reward_fn = reward_fn
        self.config = config
        if config.target is not None:
            self.kl_ctl = AdaptiveKLController(config.init_kl_coef, config.target, config.horizon)
        self.store: List[PPORLElement] = []

    @torch.no_grad()
    def make_experience(self, prompt_tensors, sample_outputs):
        all_tokens = torch.cat((prompt_tensors, sample_outputs), dim=1)
        attention_mask = torch.ones_like(all_tokens)
        logits, values = self.model(all_tokens, attention_mask=attention_mask)
        ref_logits = self.ref_model(all_tokens, attention_mask=attention_mask).logits
        scores = self.reward_fn(all_tokens)

        logprobs = logprobs_of_labels(logits[:, :-1, :], all_tokens[:, 1:])
        ref_logprobs = logprobs_of_labels(ref_logits[:, :-1, :], all_tokens[:, 1:])

        n_samples = prompt_tensors.shape[0]
        start = prompt_tensors.shape[1] - 1
        ends = start + attention_mask[:, prompt_tensors.shape[1] :].sum(1)

        # ok: KL001
        log_ratio = (logprobs - ref_logprobs) * attention_mask[:, :-1]
        # ok: KL004
        kl = log_ratio.exp() - 1 - log_ratio
        mean_kl_per_token = kl.mean()
        mean_kl = kl.sum(1).mean()

        kl_penalty = self.kl_ctl.value * -log_ratio
        kl_penalty = [xs[start : ends[ix]] for ix, xs in enumerate(kl_penalty)]

        for sample_idx in range(n_samples):
            rewards = kl_penalty[sample_idx].clone()
            rewards[-1] += scores[sample_idx]
            self.store.append(
                PPORLElement(
                    query_tensor=prompt_tensors[sample_idx],
                    response_tensor=sample_outputs[sample_idx],
                    logprobs=logprobs[sample_idx, start : ends[sample_idx]],
                    values=values[sample_idx, start : ends[sample_idx]],
                    rewards=rewards,
                )
            )
        self.kl_ctl.update(mean_kl.item(), n_steps=n_samples)
        return {"policy/sqrt_kl": torch.sqrt(mean_kl).item(), "policy/kl_per_token": mean_kl_per_token.item()}

    def loss(self, batch: List[PPORLElement]):
        query_tensors = torch.stack([el.query_tensor for el in batch])
        response_tensors = torch.stack([el.response_tensor for el in batch])
        old_logprobs = torch.stack([el.logprobs for el in batch])
        old_values = torch.stack([el.values for el in batch])
        old_rewards = torch.stack([el.rewards for el in batch])
        response_length = old_rewards.shape[1]

        advantages, returns = self.config.get_advantages_and_returns(
            old_values, old_rewards, response_length, use_whitening=self.config.whiten_advantages
        )

        tokens = torch.cat((query_tensors, response_tensors), dim=1)
        attention_mask = torch.ones_like(tokens)
        logits, values_pred = self.model(tokens, attention_mask=attention_mask)
        logprobs = logprobs_of_labels(logits[:, :-1, :], tokens[:, 1:])

        start = query_tensors.shape[1] - 1
        end = start + response_length
        logprobs, values_pred, mask = (
            logprobs[:, start:end],
            values_pred[:, start:end],
            attention_mask[:, start + 1 : end + 1],
        )
        # ok: KL002
        return self.config.loss(
            logprobs=logprobs,
            values=values_pred,
            old_logprobs=old_logprobs,
            old_values=old_values,
            advantages=advantages,
            returns=returns,
            mask=mask,
        )

    def learn(self, batch_size=8):
        for _ in range(self.config.ppo_epochs):
            for i in range(0, len(self.store), batch_size):
                loss, stats = self.loss(self.store[i : i + batch_size])
                self.opt.zero_grad()
                self.accelerator.backward(loss)
                self.opt.step()
        self.store.clear()
