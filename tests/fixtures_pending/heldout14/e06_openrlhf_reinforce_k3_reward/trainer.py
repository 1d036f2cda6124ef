import torch
import torch.nn as nn

from .experience_maker import ExperienceMaker, ReinforceConfig
from .utils import log_probs_from_logits, masked_mean


class PolicyLoss(nn.Module):
    """Clipped surrogate; with fresh samples the ratio is 1 and this is REINFORCE."""

    def __init__(self, clip_eps: float = 0.2):
        super().__init__()
        self.clip_eps = clip_eps

    def forward(self, log_probs, old_log_probs, advantages, action_mask=None):
        ratio = (log_probs - old_log_probs).exp()
        surr1 = ratio * advantages
        surr2 = ratio.clamp(1 - self.clip_eps, 1 + self.clip_eps) * advantages
        loss = -torch.min(surr1, surr2)
        return masked_mean(loss, action_mask, dim=-1).mean()


class ReinforceTrainer:
    def __init__(self, strategy, actor, initial_model, actor_optim, actor_scheduler, generate_fn, reward_fn, config=None):
        self.strategy = strategy
        self.actor = actor
        self.actor_optim = actor_optim
        self.actor_scheduler = actor_scheduler
        self.generate_fn = generate_fn
        self.reward_fn = reward_fn
        self.config = config or ReinforceConfig()
        self.actor_loss_fn = PolicyLoss()
        self.experience_maker = ExperienceMaker(actor, initial_model, self.config)
        self.replay_buffer = []

    def training_step(self, experience):
        self.actor.train()
        num_actions = experience.action_mask.size(1)
        logits = self.actor(experience.sequences, attention_mask=experience.attention_mask).logits
        action_log_probs = log_probs_from_logits(logits[:, :-1, :], experience.sequences[:, 1:])[:, -num_actions:]

        actor_loss = self.actor_loss_fn(
            action_log_probs,
            experience.action_log_probs,
            experience.advantages,
            action_mask=experience.action_mask,
        )
        self.strategy.backward(actor_loss, self.actor, self.actor_optim)
        self.strategy.optimizer_step(self.actor_optim, self.actor, self.actor_scheduler, name="actor")
        return {"policy_loss": actor_loss.item(), "kl": experience.info["kl"].mean().item()}

    def fit(self, prompts_dataloader, num_episodes=1):
        for _ in range(num_episodes):
            for prompts in prompts_dataloader:
                sequences, attention_mask, action_mask = self.generate_fn(prompts)
                scores = self.reward_fn(sequences, attention_mask)
                experience = self.experience_maker.make_experience(sequences, attention_mask, action_mask, scores)
                self.replay_buffer.append(experience)
                for item in self.replay_buffer:
                    status = self.training_step(item)
                    self.strategy.print(status)
                self.replay_buffer.clear()
