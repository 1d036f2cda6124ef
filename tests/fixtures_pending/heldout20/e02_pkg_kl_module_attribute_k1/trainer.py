"""PPO actor trainer in the style of OpenRLHF's ``PPOTrainer``: the KL penalty
is a module attribute, the backward pass goes through the accelerator in a
separate training-step function."""

from dataclasses import dataclass
from typing import Dict, Optional

import torch

from .kl_penalty import TokenKLPenalty
from .reduce import masked_mean


@dataclass
class ActorTrainConfig:
    kl_coef: float = 0.01
    eps_clip: float = 0.2
    temperature: float = 1.0


class ActorPPOTrainer:
    def __init__(self, actor, optimizer, accelerator, config: Optional[ActorTrainConfig] = None):
        self.actor = actor
        self.optimizer = optimizer
        self.accelerator = accelerator
        self.config = config or ActorTrainConfig()
        self.kl_penalty = TokenKLPenalty(temperature=self.config.temperature)

    def actor_loss(self, logits: torch.Tensor, experience: Dict[str, torch.Tensor]) -> torch.Tensor:
        action_mask = experience["action_mask"]
        log_probs = self.kl_penalty.token_log_probs(logits, experience["actions"])
        ratio = (log_probs - experience["old_log_probs"]).exp()
        advantages = experience["advantages"]
        surr1 = ratio * advantages
        surr2 = ratio.clamp(1 - self.config.eps_clip, 1 + self.config.eps_clip) * advantages
        policy_loss = masked_mean(-torch.min(surr1, surr2), action_mask, dim=-1).mean()
        kl_loss = self.kl_penalty(logits, experience["actions"], experience["base_log_probs"], action_mask)
        return policy_loss + self.config.kl_coef * kl_loss


def training_step(trainer: ActorPPOTrainer, experience: Dict[str, torch.Tensor]) -> Dict[str, float]:
    num_actions = experience["actions"].size(1)
    output = trainer.actor(experience["sequences"], attention_mask=experience["attention_mask"])
    logits = output.logits[:, -num_actions - 1 : -1]
    loss = trainer.actor_loss(logits, experience)
    trainer.optimizer.zero_grad()
    trainer.accelerator.backward(loss)
    trainer.optimizer.step()
    return {"actor_loss": loss.item()}
