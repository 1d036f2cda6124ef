"""A small GRPO trainer in the style of trl.GRPOTrainer; subclasses choose the KL estimator."""
from dataclasses import dataclass

import torch
from transformers import Trainer


@dataclass
class GRPOConfig:
    beta: float = 0.04
    epsilon: float = 0.2
    num_generations: int = 8
    max_completion_length: int = 256


class KLHookGRPOTrainer(Trainer):
    def __init__(self, model, ref_model, args: GRPOConfig):
        self.model = model
        self.ref_model = ref_model
        self.args = args
        self.beta = args.beta
        self._metrics = {"kl": [], "clip_ratio": []}

    def _get_per_token_logps(self, model, input_ids, attention_mask, logits_to_keep):
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        logits = logits[:, -logits_to_keep - 1 : -1, :]
        completion_ids = input_ids[:, -logits_to_keep:]
        return torch.gather(logits.log_softmax(-1), 2, completion_ids.unsqueeze(-1)).squeeze(-1)

    def compute_kl(self, per_token_logps, ref_per_token_logps, completion_mask):
        """Per-token KL penalty, [B, T]. Subclasses pick the estimator."""
        raise NotImplementedError

    def _compute_loss(self, model, inputs):
        prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
        completion_mask = inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], completion_mask], dim=1)
        logits_to_keep = completion_ids.size(1)

        per_token_logps = self._get_per_token_logps(model, input_ids, attention_mask, logits_to_keep)
        with torch.no_grad():
            ref_per_token_logps = self._get_per_token_logps(self.ref_model, input_ids, attention_mask, logits_to_keep)

        advantages = inputs["advantages"]
        old_per_token_logps = inputs.get("old_per_token_logps")
        if old_per_token_logps is None:
            old_per_token_logps = per_token_logps.detach()
        coef_1 = torch.exp(per_token_logps - old_per_token_logps)
        coef_2 = torch.clamp(coef_1, 1 - self.args.epsilon, 1 + self.args.epsilon)
        per_token_loss = -torch.min(coef_1 * advantages.unsqueeze(1), coef_2 * advantages.unsqueeze(1))

        if self.beta != 0.0:
            # error: KL002
            per_token_kl = self.compute_kl(per_token_logps, ref_per_token_logps, completion_mask)
            per_token_loss = per_token_loss + self.beta * per_token_kl
            mean_kl = (per_token_kl * completion_mask).sum() / completion_mask.sum()
            self._metrics["kl"].append(mean_kl.item())

        # Dr. GRPO aggregation: one constant divisor, no per-sequence length weighting
        return (per_token_loss * completion_mask).sum() / (completion_mask.size(0) * self.args.max_completion_length)
