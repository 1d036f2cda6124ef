"""Experience maker: rollout log-probs, KL-shaped rewards and GAE advantages.

The settings are a plain dict merged over ``DEFAULT_ARGS`` (as parsed from the
command line), and read by key where they are used."""

from typing import Any, Callable, Dict, Optional, Tuple

import torch

from .kl import compute_approx_kl, compute_reward

DEFAULT_ARGS: Dict[str, Any] = {
    "kl_estimator": "k3",
    "init_kl_coef": 0.02,
    "gamma": 1.0,
    "lambd": 1.0,
}


def action_log_probs(model, sequences: torch.Tensor, num_actions: int, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    logits = model(sequences, attention_mask=attention_mask).logits[:, -num_actions - 1 : -1]
    log_probs = torch.log_softmax(logits, dim=-1)
    return log_probs.gather(-1, sequences[:, -num_actions:].unsqueeze(-1)).squeeze(-1)


class ExperienceMaker:
    def __init__(self, actor, critic, initial_model, reward_fn: Callable, args: Optional[Dict[str, Any]] = None):
        self.actor = actor
        self.critic = critic
        self.initial_model = initial_model
        self.reward_fn = reward_fn
        self.args = {**DEFAULT_ARGS, **(args or {})}
        self.kl_coef = self.args["init_kl_coef"]

    @torch.no_grad()
    def make_experience(self, sequences: torch.Tensor, attention_mask: torch.Tensor, action_mask: torch.Tensor) -> Dict[str, torch.Tensor]:
        num_actions = action_mask.size(1)
        log_probs = action_log_probs(self.actor, sequences, num_actions, attention_mask)
        base_log_probs = action_log_probs(self.initial_model, sequences, num_actions, attention_mask)
        values = self.critic(sequences, num_actions, attention_mask)
        r = self.reward_fn(sequences)

        # error: KL004
        kl = compute_approx_kl(log_probs, base_log_probs, kl_estimator=self.args["kl_estimator"])
        reward = compute_reward(r, self.kl_coef, kl, action_mask)
        advantages, returns = self.get_advantages_and_returns(values, reward, action_mask, self.args["gamma"], self.args["lambd"])
        return {
            "sequences": sequences,
            "attention_mask": attention_mask,
            "action_mask": action_mask,
            "action_log_probs": log_probs,
            "values": values,
            "returns": returns,
            "advantages": advantages,
            "kl": kl,
        }

    @torch.no_grad()
    def get_advantages_and_returns(
        self, values: torch.Tensor, rewards: torch.Tensor, action_mask: torch.Tensor, gamma: float, lambd: float
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        lastgaelam = 0
        advantages_reversed = []
        response_length = rewards.size(1)
        values = action_mask * values
        rewards = action_mask * rewards
        for t in reversed(range(response_length)):
            nextvalues = values[:, t + 1] if t < response_length - 1 else 0.0
            delta = rewards[:, t] + gamma * nextvalues - values[:, t]
            lastgaelam = delta + gamma * lambd * lastgaelam
            advantages_reversed.append(lastgaelam)
        advantages = torch.stack(advantages_reversed[::-1], dim=1)
        returns = advantages + values
        return advantages.detach(), returns
