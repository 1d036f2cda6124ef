"""GRPO variant that moves the KL penalty from the loss into the advantages.

Instead of TRL's ``beta * per_token_kl`` loss term, the rollout subtracts the
per-token log-ratio to the reference from each token's advantage (the group
baseline is shared by every token of a completion).  The loss uses the Dr. GRPO
normalisation: a sum over tokens divided by a constant.
"""

from dataclasses import dataclass
from typing import Any, Dict

import torch


@dataclass
class GRPOConfig:
    num_generations: int = 8
    max_completion_length: int = 512
    beta: float = 0.04
    epsilon: float = 0.2
    epsilon_high: float = 0.28
    temperature: float = 1.0
    gradient_accumulation_steps: int = 4


class GRPOTrainer:
    def __init__(self, model, ref_model, accelerator, args: GRPOConfig = GRPOConfig()):
        self.model = model
        self.ref_model = ref_model
        self.accelerator = accelerator
        self.args = args

    def _get_per_token_logps(self, model, input_ids, attention_mask, logits_to_keep: int) -> torch.Tensor:
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        logits = logits[:, -logits_to_keep - 1 : -1, :] / self.args.temperature
        completion_ids = input_ids[:, -logits_to_keep:]
        return torch.gather(logits.log_softmax(-1), 2, completion_ids.unsqueeze(-1)).squeeze(-1)

    def _compute_advantages(
        self,
        rewards: torch.Tensor,
        old_per_token_logps: torch.Tensor,
        ref_per_token_logps: torch.Tensor,
        completion_mask: torch.Tensor,
    ) -> torch.Tensor:
        with torch.no_grad():
            mean_grouped_rewards = rewards.view(-1, self.args.num_generations).mean(dim=1)
            mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(self.args.num_generations, dim=0)
            advantages = rewards - mean_grouped_rewards
            # error: KL003
            per_token_kl = (old_per_token_logps - ref_per_token_logps) * completion_mask
            token_advantages = advantages.unsqueeze(1) - self.args.beta * per_token_kl
        return token_advantages

    def _generate_and_score(self, inputs: Dict[str, Any]) -> Dict[str, torch.Tensor]:
        prompt_completion_ids = inputs["prompt_completion_ids"]
        attention_mask = inputs["attention_mask"]
        completion_mask = inputs["completion_mask"]
        logits_to_keep = completion_mask.size(1)
        with torch.no_grad():
            old_per_token_logps = self._get_per_token_logps(self.model, prompt_completion_ids, attention_mask, logits_to_keep)
            ref_per_token_logps = self._get_per_token_logps(self.ref_model, prompt_completion_ids, attention_mask, logits_to_keep)
        advantages = self._compute_advantages(inputs["rewards"], old_per_token_logps, ref_per_token_logps, completion_mask)
        return {
            "prompt_completion_ids": prompt_completion_ids,
            "attention_mask": attention_mask,
            "completion_mask": completion_mask,
            "old_per_token_logps": old_per_token_logps,
            "advantages": advantages,
        }

    def grpo_loss(
        self,
        per_token_logps: torch.Tensor,
        old_per_token_logps: torch.Tensor,
        advantages: torch.Tensor,
        completion_mask: torch.Tensor,
    ) -> torch.Tensor:
        coef_1 = torch.exp(per_token_logps - old_per_token_logps)
        coef_2 = torch.clamp(coef_1, 1 - self.args.epsilon, 1 + self.args.epsilon_high)
        per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
        return (per_token_loss * completion_mask).sum() / (per_token_loss.size(0) * self.args.max_completion_length)

    def compute_loss(self, model, inputs: Dict[str, torch.Tensor]) -> torch.Tensor:
        logits_to_keep = inputs["completion_mask"].size(1)
        per_token_logps = self._get_per_token_logps(model, inputs["prompt_completion_ids"], inputs["attention_mask"], logits_to_keep)
        return self.grpo_loss(per_token_logps, inputs["old_per_token_logps"], inputs["advantages"], inputs["completion_mask"])

    def training_step(self, model, inputs: Dict[str, Any]) -> torch.Tensor:
        batch = self._generate_and_score(inputs)
        loss = self.compute_loss(model, batch)
        self.accelerator.backward(loss / self.args.gradient_accumulation_steps)
        return loss.detach()
