"""An unsloth-style fused GRPO loss on LoRA models.

The loss takes *logits* named ``ref``, ``new`` and ``old`` and turns them into sampled
log-probs itself (gather minus logsumexp, no full log-softmax). The reference logits come
from the same model with its adapters switched off. Completions are freshly sampled.

- GRPO's k3 per token (``exp(ref - new) - (ref - new) - 1``): KL002;
- the reward-to-go score function ``kl_to_go_t * new_t``: quiet;
- PPO's approximate KL between ``old`` and ``new`` for the logs: quiet (no reference).

Fixture: parsed by the tests, never executed.
"""

from __future__ import annotations

import torch


def selective_log_softmax(x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    x = x.float()
    return x.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(x, dim=-1)


def grpo_compute_loss(ref, new, old, input_ids, mask, beta, advantages, epsilon_low=0.2, epsilon_high=0.2):
    new_x = selective_log_softmax(new, input_ids)
    with torch.no_grad():
        ref_x = selective_log_softmax(ref, input_ids)
        old_x = selective_log_softmax(old, input_ids) if old is not None else new_x.detach()

    # error: KL002
    kl_i = torch.exp(ref_x - new_x) - (ref_x - new_x) - 1.0
    coef_1 = torch.exp(new_x - old_x)
    coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
    loss_1 = coef_1 * advantages.unsqueeze(1)
    loss_2 = coef_2 * advantages.unsqueeze(1)
    loss_i = -torch.min(loss_1, loss_2)
    if beta != 0.0:
        loss_i = loss_i + beta * kl_i

    mask = mask.to(torch.float32)
    n_mask_per_reward = mask.sum(1)
    loss_per_reward = (loss_i * mask).sum(1) / n_mask_per_reward
    loss = loss_per_reward.mean()

    with torch.no_grad():
        completion_length = n_mask_per_reward.mean()
        mean_kl = ((kl_i * mask).sum(1) / n_mask_per_reward).mean()
    return loss, completion_length, mean_kl


def grpo_compute_loss_kl_to_go(ref, new, old, input_ids, mask, beta, advantages, epsilon=0.2):
    new_x = selective_log_softmax(new, input_ids)
    with torch.no_grad():
        ref_x = selective_log_softmax(ref, input_ids)
        old_x = selective_log_softmax(old, input_ids)
        # ok: KL001, KL002, KL003, KL004, KL005, KL006
        approx_kl = (torch.exp(old_x - new_x) - (old_x - new_x) - 1.0) * mask

    mask = mask.to(torch.float32)
    # ok: KL001, KL002, KL003, KL004, KL005, KL006
    log_ratio = ((new_x - ref_x) * mask).detach()
    kl_to_go = log_ratio.flip(1).cumsum(1).flip(1)
    coef_1 = torch.exp(new_x - old_x)
    loss_i = -torch.min(coef_1 * advantages.unsqueeze(1), coef_1.clamp(1 - epsilon, 1 + epsilon) * advantages.unsqueeze(1))
    # ok: KL001, KL002, KL003, KL004, KL005, KL006
    loss_i = loss_i + beta * kl_to_go * new_x
    loss = (loss_i * mask).sum() / mask.shape[0]
    return loss, approx_kl.sum() / mask.sum()


class UnslothGRPOTrainer:
    def __init__(self, model, optimizer, beta: float = 0.04, use_kl_to_go: bool = False):
        self.model = model
        self.optimizer = optimizer
        self.beta = beta
        self.use_kl_to_go = use_kl_to_go

    def _get_logits(self, input_ids, attention_mask, logits_to_keep):
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=logits_to_keep + 1).logits
        return logits[:, :-1, :]

    def compute_loss(self, inputs):
        prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
        completion_mask = inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], completion_mask], dim=1)
        logits_to_keep = completion_ids.size(1)

        new_logits = self._get_logits(input_ids, attention_mask, logits_to_keep)
        with self.model.disable_adapter():
            ref_logits = self._get_logits(input_ids, attention_mask, logits_to_keep)
        old_logits = inputs.get("old_logits")
        if self.use_kl_to_go:
            loss, _ = grpo_compute_loss_kl_to_go(ref_logits, new_logits, old_logits, completion_ids, completion_mask, self.beta, inputs["advantages"])
        else:
            loss, _, _ = grpo_compute_loss(ref_logits, new_logits, old_logits, completion_ids, completion_mask, self.beta, inputs["advantages"])
        return loss

    def training_step(self, inputs):
        loss = self.compute_loss(inputs)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        return loss.detach()

