"""GRPO as a ``transformers.Trainer.compute_loss`` override.

Completions and advantages are produced by ``_prepare_inputs`` (not shown);
``compute_loss`` adds a KL penalty to the reference model. The penalty
helper is wrapped in ``torch.no_grad()`` to keep the reference graph from
being retained ("the ref model has no grads anyway").
"""

from collections import defaultdict

import torch
from transformers import Trainer


class GRPOWithReferenceTrainer(Trainer):
    def __init__(self, model, ref_model, beta=0.04, epsilon=0.2, **kwargs):
        super().__init__(model=model, **kwargs)
        self.ref_model = ref_model
        self.beta = beta
        self.epsilon = epsilon
        self._metrics = defaultdict(list)

    @staticmethod
    def _get_per_token_logps(model, input_ids, attention_mask, logits_to_keep):
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        logits = logits[:, :-1, :][:, -logits_to_keep:]
        target_ids = input_ids[:, -logits_to_keep:]
        return torch.gather(logits.log_softmax(dim=-1), dim=2, index=target_ids.unsqueeze(-1)).squeeze(-1)

    @torch.no_grad()
    def _reference_kl(self, per_token_logps, ref_per_token_logps):
        # Schulman's k3, always >= 0
        delta = ref_per_token_logps - per_token_logps
        return torch.exp(delta) - delta - 1

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if return_outputs:
            raise ValueError("The GRPOWithReferenceTrainer does not support returning outputs")
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        logits_to_keep = completion_ids.size(1)

        per_token_logps = self._get_per_token_logps(model, input_ids, attention_mask, logits_to_keep)
        with torch.no_grad():
            ref_per_token_logps = self._get_per_token_logps(self.ref_model, input_ids, attention_mask, logits_to_keep)

        # error: KL005
        per_token_kl = self._reference_kl(per_token_logps, ref_per_token_logps)

        advantages = inputs["advantages"]
        old_per_token_logps = inputs.get("old_per_token_logps", per_token_logps.detach())
        coef_1 = torch.exp(per_token_logps - old_per_token_logps)
        coef_2 = torch.clamp(coef_1, 1 - self.epsilon, 1 + self.epsilon)
        per_token_loss1 = coef_1 * advantages.unsqueeze(1)
        per_token_loss2 = coef_2 * advantages.unsqueeze(1)
        per_token_loss = -torch.min(per_token_loss1, per_token_loss2)
        per_token_loss = per_token_loss + self.beta * per_token_kl
        loss = ((per_token_loss * completion_mask).sum(dim=1) / completion_mask.sum(dim=1).clamp(min=1.0)).mean()

        mean_kl = (per_token_kl * completion_mask).sum(dim=1) / completion_mask.sum(dim=1)
        self._metrics["kl"].append(mean_kl.mean().item())
        return loss
