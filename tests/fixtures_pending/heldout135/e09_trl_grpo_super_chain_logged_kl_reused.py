# Reviewer: a TRL GRPO-style subclass chain. LoggingGRPOTrainer.compute_loss
# computes the per-token KL (k3) only for logging, under torch.no_grad(), and
# keeps it on self. KLGRPOTrainer.compute_loss calls
# super().compute_loss(...) and adds beta * self.kl_loss, a @property that
# reduces that stored, gradient-free KL. The penalty is a constant for autograd:
# its gradient is exactly zero.
# Verdict: bug, KL005, on the line that computes the estimate under no_grad.
from collections import defaultdict
from dataclasses import dataclass

import torch

from trl import GRPOConfig
from transformers import Trainer


@dataclass
class KLGRPOConfig(GRPOConfig):
    beta: float = 0.04
    epsilon: float = 0.2


class LoggingGRPOTrainer(Trainer):
    def __init__(self, args: KLGRPOConfig, model=None, ref_model=None, **kwargs):
        self.args = args
        self.model = model
        self.ref_model = ref_model
        self._metrics = defaultdict(list)

    def _get_per_token_logps(self, model, input_ids, attention_mask, logits_to_keep):
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -logits_to_keep - 1 : -1]
        ids = input_ids[:, -logits_to_keep:]
        return torch.gather(logits.log_softmax(-1), 2, ids.unsqueeze(-1)).squeeze(-1)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        completion_mask = inputs["completion_mask"]
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], completion_mask], dim=1)
        per_token_logps = self._get_per_token_logps(model, input_ids, attention_mask, completion_mask.size(1))
        ref_per_token_logps = inputs["ref_per_token_logps"]

        old_per_token_logps = inputs.get("old_per_token_logps", per_token_logps.detach())
        coef_1 = torch.exp(per_token_logps - old_per_token_logps)
        coef_2 = torch.clamp(coef_1, 1 - self.args.epsilon, 1 + self.args.epsilon)
        advantages = inputs["advantages"].unsqueeze(1)
        per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
        loss = (per_token_loss * completion_mask).sum(dim=1).mean()

        with torch.no_grad():
            # error: KL005
            per_token_kl = torch.exp(ref_per_token_logps - per_token_logps) - (ref_per_token_logps - per_token_logps) - 1
            mean_kl = (per_token_kl * completion_mask).sum() / completion_mask.sum()
            self._metrics["kl"].append(mean_kl.item())
        self._last_per_token_kl = per_token_kl
        self._last_completion_mask = completion_mask
        return loss


class KLGRPOTrainer(LoggingGRPOTrainer):
    @property
    def kl_loss(self):
        return (self._last_per_token_kl * self._last_completion_mask).sum(dim=1).mean()

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if self.args.beta != 0.0:
            loss = loss + self.args.beta * self.kl_loss
        return loss

    def training_step(self, model, inputs, optimizer):
        model.train()
        loss = self.compute_loss(model, inputs)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.detach()
