"""The actor side: a clipped PPO loss on advantages read back from the batch.

The advantages (and the KL they carry) were computed by ``advantages.py``; any verdict on
that KL belongs there, where the log-ratio is formed, not here.

Fixture: parsed by the tests, never executed.
"""

from __future__ import annotations

import torch

from .advantages import compute_advantage


def masked_mean(values, mask):
    return (values * mask).sum() / mask.sum().clamp(min=1)


class PPOActor:
    def __init__(self, module, optimizer, clip_ratio: float = 0.2):
        self.module = module
        self.optimizer = optimizer
        self.clip_ratio = clip_ratio

    def log_probs(self, batch):
        response_length = batch["responses"].size(1)
        logits = self.module(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        logits = logits[:, -response_length - 1 : -1].float()
        return torch.gather(logits.log_softmax(-1), 2, batch["responses"].unsqueeze(-1)).squeeze(-1)

    def update_policy(self, data):
        batch = data.batch
        response_mask = batch["response_mask"]
        # ok: KL001, KL002, KL003, KL004, KL005, KL006
        advantages = batch["advantages"]
        old_log_prob = batch["old_log_probs"]
        log_prob = self.log_probs(batch)
        ratio = torch.exp(log_prob - old_log_prob)
        pg_losses = -advantages * ratio
        pg_losses_clipped = -advantages * torch.clamp(ratio, 1 - self.clip_ratio, 1 + self.clip_ratio)
        pg_loss = masked_mean(torch.maximum(pg_losses, pg_losses_clipped), response_mask)
        self.optimizer.zero_grad()
        pg_loss.backward()
        self.optimizer.step()
        return pg_loss.item()


class Trainer:
    def __init__(self, actor: PPOActor, ref_module, adv_estimator: str = "grpo_token_kl", kl_coef: float = 0.01):
        self.actor = actor
        self.ref_module = ref_module
        self.adv_estimator = adv_estimator
        self.kl_coef = kl_coef

    def fit_step(self, data):
        with torch.no_grad():
            data.batch["old_log_probs"] = self.actor.log_probs(data.batch)
            response_length = data.batch["responses"].size(1)
            ref_logits = self.ref_module(data.batch["input_ids"], attention_mask=data.batch["attention_mask"]).logits
            ref_logits = ref_logits[:, -response_length - 1 : -1].float()
            data.batch["ref_log_prob"] = torch.gather(
                ref_logits.log_softmax(-1), 2, data.batch["responses"].unsqueeze(-1)
            ).squeeze(-1)
        data = compute_advantage(data, adv_estimator=self.adv_estimator, kl_coef=self.kl_coef)
        return self.actor.update_policy(data)
