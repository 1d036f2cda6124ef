"""GRPO trainer loss in the style of TRL's ``GRPOTrainer.compute_loss``.

The reference log-probs come from the rollout step; the KL to the reference
is the usual low-variance (k3) estimate, added to the per-token loss.
"""

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class GRPOConfig:
    beta: float = 0.04
    epsilon: float = 0.2
    temperature: float = 1.0
    loss_type: str = "bnpo"
    log_completions: bool = False


def selective_log_softmax(logits, index):
    logps = F.log_softmax(logits, dim=-1)
    return torch.gather(logps, dim=-1, index=index.unsqueeze(-1)).squeeze(-1)


class GRPOTrainer:
    def __init__(self, model, args: GRPOConfig, optimizer=None):
        self.model = model
        self.args = args
        self.beta = args.beta
        self.epsilon = args.epsilon
        self.temperature = args.temperature
        self.loss_type = args.loss_type
        self.optimizer = optimizer
        self._metrics = {"kl": [], "clip_ratio": []}

    def _get_per_token_logps(self, model, input_ids, attention_mask, logits_to_keep):
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        logits = logits[:, :-1, :]
        input_ids = input_ids[:, -logits_to_keep:]
        logits = logits[:, -logits_to_keep:] / self.temperature
        return selective_log_softmax(logits, input_ids)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        logits_to_keep = completion_ids.size(1)

        per_token_logps = self._get_per_token_logps(model, input_ids, attention_mask, logits_to_keep)

        if self.beta != 0.0:
            ref_per_token_logps = inputs["ref_per_token_logps"]
            # error: KL002
            per_token_kl = torch.exp(ref_per_token_logps - per_token_logps) - (ref_per_token_logps - per_token_logps) - 1

        advantages = inputs["advantages"]
        old_per_token_logps = inputs.get("old_per_token_logps")
        if old_per_token_logps is None:
            old_per_token_logps = per_token_logps.detach()
        coef_1 = torch.exp(per_token_logps - old_per_token_logps)
        coef_2 = torch.clamp(coef_1, 1 - self.epsilon, 1 + self.epsilon)
        per_token_loss1 = coef_1 * advantages.unsqueeze(1)
        per_token_loss2 = coef_2 * advantages.unsqueeze(1)
        per_token_loss = -torch.min(per_token_loss1, per_token_loss2)
        if self.beta != 0.0:
            per_token_loss = per_token_loss + self.beta * per_token_kl

        if self.loss_type == "grpo":
            loss = ((per_token_loss * completion_mask).sum(-1) / completion_mask.sum(-1).clamp(min=1.0)).mean()
        elif self.loss_type == "bnpo":
            loss = (per_token_loss * completion_mask).sum() / completion_mask.sum().clamp(min=1.0)
        else:
            raise ValueError(f"Unknown loss type: {self.loss_type}")

        if self.beta != 0.0:
            mean_kl = (per_token_kl * completion_mask).sum() / completion_mask.sum()
            self._metrics["kl"].append(mean_kl.item())
        is_clipped = (per_token_loss1 < per_token_loss2).float()
        self._metrics["clip_ratio"].append(((is_clipped * completion_mask).sum() / completion_mask.sum()).item())
        return loss
