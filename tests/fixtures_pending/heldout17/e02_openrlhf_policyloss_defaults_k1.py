"""OpenRLHF-style PPO actor loss with the KL to the initial model as a loss term.

Settings come from the module-level ``DEFAULTS`` table (what the CLI would fill
in); ``PolicyLoss`` picks the KL estimator from it when the trainer does not
say otherwise.
"""

from typing import Dict, Optional

import torch
import torch.nn as nn

DEFAULTS = {
    "actor_learning_rate": 1e-6,
    "eps_clip": 0.2,
    "init_kl_coef": 0.01,
    "use_kl_loss": True,
    "kl_estimator": "k1",
    "micro_train_batch_size": 2,
    "max_norm": 1.0,
}


def compute_approx_kl(
    log_probs: torch.Tensor,
    log_probs_base: torch.Tensor,
    kl_estimator: str = "k1",
) -> torch.Tensor:
    """Compute the approximate KL divergence between two distributions.

    Schulman blog: http://joschu.net/blog/kl-approx.html
    """
    if kl_estimator == "k1":
        log_ratio = log_probs.float() - log_probs_base.float()
    elif kl_estimator == "k2":
        log_ratio = log_probs.float() - log_probs_base.float()
        log_ratio = log_ratio**2 / 2.0
    elif kl_estimator == "k3":
        log_ratio = log_probs.float() - log_probs_base.float()
        log_ratio = -log_ratio
        log_ratio = log_ratio.exp() - 1 - log_ratio
    else:
        raise ValueError(f"unknown kl_estimator {kl_estimator}")
    log_ratio = log_ratio.clamp(min=-10, max=10)
    return log_ratio


class PolicyLoss(nn.Module):
    """Clipped PPO objective plus ``kl_coef`` times the KL to the reference model."""

    def __init__(self, clip_eps: float = 0.2, kl_coef: float = 0.01, kl_estimator: str = DEFAULTS["kl_estimator"]) -> None:
        super().__init__()
        self.clip_eps = clip_eps
        self.kl_coef = kl_coef
        self.kl_estimator = kl_estimator

    def forward(
        self,
        log_probs: torch.Tensor,
        old_log_probs: torch.Tensor,
        advantages: torch.Tensor,
        base_log_probs: torch.Tensor,
        action_mask: torch.Tensor,
    ) -> torch.Tensor:
        ratio = (log_probs - old_log_probs).exp()
        surr1 = ratio * advantages
        surr2 = ratio.clamp(1 - self.clip_eps, 1 + self.clip_eps) * advantages
        loss = -torch.min(surr1, surr2)
        # error: KL001
        kl = compute_approx_kl(log_probs, base_log_probs, kl_estimator=self.kl_estimator)
        loss = loss + self.kl_coef * kl
        return (loss * action_mask).sum(dim=-1).mean()


class ActorPPOTrainer:
    def __init__(self, actor: nn.Module, actor_optim, strategy, args: Optional[Dict] = None) -> None:
        self.args = dict(DEFAULTS) if args is None else args
        self.actor = actor
        self.actor_optim = actor_optim
        self.strategy = strategy
        self.actor_loss_fn = PolicyLoss(clip_eps=self.args["eps_clip"], kl_coef=self.args["init_kl_coef"])

    def _action_log_probs(self, sequences: torch.Tensor, num_actions: int, attention_mask: torch.Tensor) -> torch.Tensor:
        logits = self.actor(sequences, attention_mask=attention_mask).logits[:, :-1, :]
        log_probs = torch.log_softmax(logits, dim=-1)
        log_probs = log_probs.gather(-1, sequences[:, 1:].unsqueeze(-1)).squeeze(-1)
        return log_probs[:, -num_actions:]

    def training_step_actor(self, experience: Dict[str, torch.Tensor]) -> Dict[str, float]:
        self.actor.train()
        action_mask = experience["action_mask"]
        num_actions = action_mask.size(1)
        action_log_probs = self._action_log_probs(experience["sequences"], num_actions, experience["attention_mask"])
        actor_loss = self.actor_loss_fn(
            action_log_probs,
            experience["action_log_probs"],
            experience["advantages"],
            experience["base_action_log_probs"],
            action_mask,
        )
        self.strategy.backward(actor_loss, self.actor, self.actor_optim)
        self.strategy.optimizer_step(self.actor_optim, self.actor, "actor")
        return {"policy_loss": actor_loss.item()}
