from dataclasses import dataclass, field

import torch

from .utils import (
    FixedKLController,
    compute_approx_kl,
    compute_reward,
    get_cumulative_returns,
    log_probs_from_logits,
    masked_mean,
)


@dataclass
class ReinforceConfig:
    advantage_estimator: str = "reinforce"
    # k3 has the lowest variance of Schulman's estimators
    kl_estimator: str = "k3"
    init_kl_coef: float = 0.01
    gamma: float = 1.0
    n_samples_per_prompt: int = 1
    normalize_advantages: bool = False
    micro_train_batch_size: int = 8


@dataclass
class Experience:
    sequences: torch.Tensor
    action_log_probs: torch.Tensor
    base_action_log_probs: torch.Tensor
    advantages: torch.Tensor
    attention_mask: torch.Tensor
    action_mask: torch.Tensor
    info: dict = field(default_factory=dict)


class ExperienceMaker:
    def __init__(self, actor, initial_model, config: ReinforceConfig):
        self.actor = actor
        self.initial_model = initial_model
        self.config = config
        self.kl_ctl = FixedKLController(config.init_kl_coef)

    def _action_log_probs(self, model, sequences, attention_mask, num_actions):
        logits = model(sequences, attention_mask=attention_mask).logits
        return log_probs_from_logits(logits[:, :-1, :], sequences[:, 1:])[:, -num_actions:]

    @torch.no_grad()
    def make_experience(self, sequences, attention_mask, action_mask, scores):
        self.actor.eval()
        num_actions = action_mask.size(1)
        action_log_probs = self._action_log_probs(self.actor, sequences, attention_mask, num_actions)
        base_action_log_probs = self._action_log_probs(self.initial_model, sequences, attention_mask, num_actions)

        # error: KL004
        kl = compute_approx_kl(action_log_probs, base_action_log_probs, action_mask=action_mask, kl_estimator=self.config.kl_estimator)
        reward = compute_reward(scores, self.kl_ctl.value, kl, action_mask=action_mask)
        returns = get_cumulative_returns(reward, action_mask, self.config.gamma)
        advantages = returns
        if self.config.normalize_advantages:
            flat = advantages[action_mask.bool()]
            advantages = (advantages - flat.mean()) / (flat.std() + 1e-8) * action_mask

        info = {
            "kl": masked_mean(kl, action_mask, dim=-1),
            "reward": scores,
            "return": reward.sum(dim=-1),
            "response_length": action_mask.float().sum(dim=-1),
        }
        self.actor.train()
        return Experience(
            sequences=sequences,
            action_log_probs=action_log_probs,
            base_action_log_probs=base_action_log_probs,
            advantages=advantages,
            attention_mask=attention_mask,
            action_mask=action_mask,
            info=info,
        )
