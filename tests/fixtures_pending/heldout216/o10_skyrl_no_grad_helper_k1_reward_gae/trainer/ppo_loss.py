"""Clipped PPO loss with an optional KL loss to the reference model."""

from dataclasses import dataclass

import torch
from omegaconf import DictConfig  # noqa: F401

from ..utils import compute_approx_kl, masked_mean, reduce_loss


@dataclass
class PolicyLossConfig:
    eps_clip_low: float = 0.2
    eps_clip_high: float = 0.2
    use_kl_loss: bool = False
    use_kl_in_reward: bool = True
    gamma: float = 1.0
    lambd: float = 1.0
    kl_loss_coef: float = 0.02
    kl_estimator_type: str = "k1"
    loss_reduction: str = "seq_mean_token_sum"


class PolicyLoss:
    def __init__(self, cfg: PolicyLossConfig):
        self.cfg = cfg

    def apply_kl_penalty(self, rewards, log_probs, base_log_probs, values, loss_mask):
        """Token rewards minus kl_coef * KL, then GAE advantages (no gradient)."""
        cfg = self.cfg
        # ok: KL005
        kl = compute_approx_kl(log_probs, base_log_probs, loss_mask=loss_mask, kl_estimator_type=cfg.kl_estimator_type)
        token_rewards = (rewards - cfg.kl_loss_coef * kl) * loss_mask
        advantages, lastgaelam = torch.zeros_like(token_rewards), 0.0
        for t in reversed(range(token_rewards.size(-1))):
            next_value = values[:, t + 1] * loss_mask[:, t + 1] if t + 1 < values.size(-1) else 0.0
            delta = token_rewards[:, t] + cfg.gamma * next_value - values[:, t]
            lastgaelam = (delta + cfg.gamma * cfg.lambd * lastgaelam) * loss_mask[:, t]
            advantages[:, t] = lastgaelam
        return advantages.detach() * loss_mask

    def __call__(self, log_probs, old_log_probs, base_log_probs, advantages, loss_mask):
        cfg = self.cfg
        ratio = (log_probs - old_log_probs).exp()
        surr1 = ratio * advantages
        surr2 = ratio.clamp(1 - cfg.eps_clip_low, 1 + cfg.eps_clip_high) * advantages
        policy_loss = reduce_loss(-torch.min(surr1, surr2), loss_mask, cfg.loss_reduction)
        stats = {"policy_loss": policy_loss.item()}
        if cfg.use_kl_loss:
            kl = compute_approx_kl(log_probs, base_log_probs, loss_mask=loss_mask, kl_estimator_type=cfg.kl_estimator_type)
            kl_loss = reduce_loss(kl, loss_mask, cfg.loss_reduction)
            policy_loss = policy_loss + cfg.kl_loss_coef * kl_loss
            stats["kl_loss"] = kl_loss.item()
        stats["ratio"] = masked_mean(ratio, loss_mask).item()
        return policy_loss, stats

    def step(self, model, optimizer, batch):
        log_probs = model.logprobs(batch["sequences"], batch["attention_mask"], batch["num_actions"])
        loss, stats = self(log_probs, batch["action_log_probs"], batch["base_action_log_probs"],
                           batch["advantages"], batch["loss_mask"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return stats
