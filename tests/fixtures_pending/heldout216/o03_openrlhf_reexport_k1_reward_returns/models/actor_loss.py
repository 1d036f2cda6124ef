"""PPO policy loss with an optional KL loss to the initial model."""

from dataclasses import dataclass

import torch
import deepspeed  # noqa: F401  (the actor is wrapped by the strategy)

from ..utils import compute_approx_kl, compute_reward, log_probs_from_logits, masked_sum


@dataclass
class ActorArgs:
    eps_clip: float = 0.2
    use_kl_loss: bool = False
    gamma: float = 1.0
    init_kl_coef: float = 0.01
    kl_estimator: str = "k1"
    generate_max_len: int = 1024


class ActorLoss:
    def __init__(self, actor, optimizer, args: ActorArgs):
        self.actor = actor
        self.optimizer = optimizer
        self.args = args

    def policy_loss(self, log_probs, old_log_probs, advantages, action_mask):
        ratio = (log_probs - old_log_probs).exp()
        surr1 = ratio * advantages
        surr2 = ratio.clamp(1 - self.args.eps_clip, 1 + self.args.eps_clip) * advantages
        loss = -torch.min(surr1, surr2)
        return (masked_sum(loss, action_mask, dim=-1) / self.args.generate_max_len).mean()

    @torch.no_grad()
    def make_experience(self, action_log_probs, base_action_log_probs, rewards, action_mask):
        # ok: KL001
        kl = compute_approx_kl(action_log_probs, base_action_log_probs, kl_estimator=self.args.kl_estimator)
        token_rewards = compute_reward(rewards, self.args.init_kl_coef, kl, action_mask=action_mask)
        returns = torch.zeros_like(token_rewards)
        running = torch.zeros_like(token_rewards[:, 0])
        for t in reversed(range(token_rewards.size(1))):
            running = token_rewards[:, t] + self.args.gamma * running
            returns[:, t] = running
        return returns * action_mask

    def compute_loss(self, action_log_probs, old_action_log_probs, base_action_log_probs, advantages, action_mask):
        actor_loss = self.policy_loss(action_log_probs, old_action_log_probs, advantages, action_mask)
        status = {"policy_loss": actor_loss.item()}
        if self.args.use_kl_loss and base_action_log_probs is not None:
            kl = compute_approx_kl(action_log_probs, base_action_log_probs, kl_estimator=self.args.kl_estimator)
            kl_loss = (masked_sum(kl, action_mask, dim=-1) / self.args.generate_max_len).mean()
            actor_loss = actor_loss + kl_loss * self.args.init_kl_coef
            status["kl"] = kl_loss.item()
        return actor_loss, status

    def training_step(self, experience):
        self.actor.train()
        num_actions = experience.action_mask.size(1)
        logits = self.actor(experience.sequences, attention_mask=experience.attention_mask).logits
        action_log_probs = log_probs_from_logits(logits[:, :-1], experience.sequences[:, 1:])[:, -num_actions:]
        loss, status = self.compute_loss(
            action_log_probs,
            experience.action_log_probs,
            experience.base_action_log_probs,
            experience.advantages,
            experience.action_mask,
        )
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        return status
