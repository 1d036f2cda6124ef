# Reviewer: OpenRLHF-style PPO with DeepSpeed. `make_experience` runs under
# `torch.no_grad()` on the rollout, computes the per-token log-ratio to the initial
# model and stores it in the `Experience`. The rewards are the outcome scores only
# (the KL is meant to be a loss, "use_kl_loss"), so `training_step_actor` adds
# `init_kl_coef * masked_mean(experience.kl)` to the actor loss and hands it to
# `strategy.backward`.
# Verdict: bug (KL005). The stored KL was computed under no_grad in another method:
# in the actor loss it is a constant, its gradient is exactly zero. The loss prints
# a KL but nothing regularises the policy. Reported where the estimate is computed.
from dataclasses import dataclass
from typing import Optional

import torch


def masked_mean(x, mask, dim=None):
    if dim is None:
        return (x * mask).sum() / mask.sum()
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)


@dataclass
class Experience:
    sequences: torch.Tensor
    action_log_probs: torch.Tensor
    advantages: Optional[torch.Tensor]
    kl: torch.Tensor
    action_mask: torch.Tensor
    attention_mask: torch.Tensor
    num_actions: int


class NaiveExperienceMaker:
    def __init__(self, actor, initial_model, reward_fn, strategy):
        self.actor = actor
        self.initial_model = initial_model
        self.reward_fn = reward_fn
        self.strategy = strategy

    @torch.no_grad()
    def make_experience(self, sequences, attention_mask, action_mask, num_actions):
        self.actor.eval()
        action_log_probs = self.actor(sequences, num_actions, attention_mask)
        base_action_log_probs = self.initial_model(sequences, num_actions, attention_mask)
        scores = self.reward_fn(sequences, attention_mask)
        # error: KL005
        kl = (action_log_probs - base_action_log_probs) * action_mask
        # GRPO-style group baseline on the outcome score; broadcast over tokens
        advantages = (scores - scores.mean()).unsqueeze(-1) * action_mask
        self.actor.train()
        return Experience(sequences, action_log_probs, advantages, kl, action_mask, attention_mask, num_actions)


class PPOTrainer:
    def __init__(self, strategy, actor, actor_optim, experience_maker, init_kl_coef=0.01, eps_clip=0.2):
        self.strategy = strategy
        self.actor = actor
        self.actor_optim = actor_optim
        self.experience_maker = experience_maker
        self.init_kl_coef = init_kl_coef
        self.eps_clip = eps_clip

    def actor_loss_fn(self, log_probs, old_log_probs, advantages, action_mask):
        ratio = (log_probs - old_log_probs).exp()
        surr1 = ratio * advantages
        surr2 = ratio.clamp(1 - self.eps_clip, 1 + self.eps_clip) * advantages
        return masked_mean(-torch.min(surr1, surr2), action_mask, dim=-1).mean()

    def training_step_actor(self, experience: Experience):
        self.actor.train()
        action_log_probs = self.actor(experience.sequences, experience.num_actions, experience.attention_mask)
        actor_loss = self.actor_loss_fn(
            action_log_probs, experience.action_log_probs, experience.advantages, experience.action_mask
        )
        kl_loss = masked_mean(experience.kl, experience.action_mask, dim=-1).mean()
        loss = actor_loss + self.init_kl_coef * kl_loss
        self.strategy.backward(loss, self.actor, self.actor_optim)
        self.strategy.optimizer_step(self.actor_optim, self.actor, name="actor")
        return {"policy_loss": actor_loss.item(), "kl": kl_loss.item()}
