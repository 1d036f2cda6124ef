from typing import Any, Callable, Dict, Optional

import torch

from .config import GRPOConfig
from .kl_estimators import get_kl_estimator


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """log_softmax(logits).gather(index) one row at a time to bound peak memory."""
    per_token_logps = []
    for row_logits, row_labels in zip(logits, index):
        row_logps = torch.log_softmax(row_logits, dim=-1)
        per_token_logps.append(row_logps.gather(-1, row_labels.unsqueeze(-1)).squeeze(-1))
    return torch.stack(per_token_logps)


class GRPOTrainer:
    def __init__(self, model, ref_model, reward_fn: Callable[..., torch.Tensor], config: Optional[GRPOConfig] = None):
        self.model = model
        self.ref_model = ref_model
        self.reward_fn = reward_fn
        self.config = config or GRPOConfig()
        self.beta = self.config.kl.coef
        self.kl_fn = get_kl_estimator(self.config.kl.estimator)
        self._metrics: Dict[str, list] = {"kl": [], "clip_ratio": []}

    def _get_per_token_logps(self, model, input_ids, attention_mask, logits_to_keep: int) -> torch.Tensor:
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        logits = logits[:, -logits_to_keep - 1 : -1, :] / self.config.temperature
        return selective_log_softmax(logits, input_ids[:, -logits_to_keep:])

    @torch.no_grad()
    def _prepare_inputs(self, prompt_ids: torch.Tensor) -> Dict[str, Any]:
        G = self.config.num_generations
        prompt_ids = prompt_ids.repeat_interleave(G, dim=0)
        sequences = self.model.generate(prompt_ids, do_sample=True, max_new_tokens=self.config.max_completion_length)
        completion_ids = sequences[:, prompt_ids.shape[1] :]
        attention_mask = torch.ones_like(sequences)
        completion_mask = torch.ones_like(completion_ids, dtype=torch.float)
        k = completion_ids.shape[1]
        old_logps = self._get_per_token_logps(self.model, sequences, attention_mask, k)
        ref_logps = self._get_per_token_logps(self.ref_model, sequences, attention_mask, k)

        rewards = self.reward_fn(prompt_ids, completion_ids).view(-1, G)
        advantages = rewards - rewards.mean(dim=1, keepdim=True)
        if self.config.scale_rewards:
            advantages = advantages / (rewards.std(dim=1, keepdim=True) + 1e-4)
        return {
            "input_ids": sequences,
            "attention_mask": attention_mask,
            "completion_mask": completion_mask,
            "old_per_token_logps": old_logps,
            "ref_per_token_logps": ref_logps,
            "advantages": advantages.view(-1),
        }

    def compute_loss(self, inputs: Dict[str, Any]) -> torch.Tensor:
        completion_mask = inputs["completion_mask"]
        logits_to_keep = completion_mask.shape[1]
        per_token_logps = self._get_per_token_logps(
            self.model, inputs["input_ids"], inputs["attention_mask"], logits_to_keep
        )
        old_per_token_logps = inputs["old_per_token_logps"]
        advantages = inputs["advantages"].unsqueeze(1)

        coef_1 = torch.exp(per_token_logps - old_per_token_logps)
        coef_2 = torch.clamp(coef_1, 1 - self.config.epsilon_low, 1 + self.config.epsilon_high)
        per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
        if self.beta != 0.0:
            # error: KL002
            per_token_kl = self.kl_fn(per_token_logps, inputs["ref_per_token_logps"], clamp=self.config.kl.clamp)
            per_token_loss = per_token_loss + self.beta * per_token_kl
            self._metrics["kl"].append(((per_token_kl * completion_mask).sum() / completion_mask.sum()).item())

        loss = ((per_token_loss * completion_mask).sum(-1) / completion_mask.sum(-1).clamp(min=1.0)).mean()
        is_clipped = (coef_1 < 1 - self.config.epsilon_low) | (coef_1 > 1 + self.config.epsilon_high)
        self._metrics["clip_ratio"].append(is_clipped.float().mean().item())
        return loss
