"""Per-token surrogate terms assembled by functions that are not named after what they feed.

The functions below return scalars that their callers hand to ``.backward()`` (or to an
accelerator's ``backward``): whatever they return is minimised, whatever their names.
They are helpers of the update methods, so each verdict is reported once, on the line of
the update method that calls the helper.

- ``penalised_surrogate``: GRPO's k3 per token, token-averaged: KL002;
- ``regularised_pg``: the log-ratio itself (k1) per token: KL001;
- ``kl_to_go_surrogate``: the reward-to-go score function: quiet.

Fixture: parsed by the tests, never executed.
"""

from __future__ import annotations

import torch


def sampled_logprobs(model, input_ids, attention_mask, response_ids):
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    logits = logits[:, -response_ids.size(1) - 1 : -1].float()
    return torch.gather(torch.log_softmax(logits, dim=-1), 2, response_ids.unsqueeze(-1)).squeeze(-1)


def penalised_surrogate(logp, ref_logp, advantages, mask, beta=0.04):
    ratio = torch.exp(logp - logp.detach())
    # ok: KL001, KL002, KL003
    penalty = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1
    per_token = -ratio * advantages.unsqueeze(1) + beta * penalty
    return (per_token * mask).sum() / mask.sum()


def regularised_pg(logp, ref_logp, advantages, mask, beta=0.04):
    seq_logp = (logp * mask).sum(-1)
    # ok: KL001, KL002, KL003
    penalty = (logp - ref_logp) * mask
    return (-(advantages * seq_logp) + beta * penalty.sum(-1)).mean()


def kl_to_go_surrogate(logp, ref_logp, advantages, mask, beta=0.04):
    seq_logp = (logp * mask).sum(-1)
    # ok: KL001, KL002, KL003, KL004, KL005, KL006
    log_ratio = ((logp - ref_logp) * mask).detach()
    to_go = log_ratio.flip(-1).cumsum(-1).flip(-1)
    # ok: KL001, KL002, KL003, KL004, KL005, KL006
    penalty = (to_go * logp * mask).sum(-1)
    return (-(advantages * seq_logp) + beta * penalty).mean()


class Updater:
    def __init__(self, model, ref_model, optimizer, accelerator=None, form: str = "k3"):
        self.model = model
        self.ref_model = ref_model
        self.optimizer = optimizer
        self.accelerator = accelerator
        self.form = form

    def _inputs(self, batch):
        logp = sampled_logprobs(self.model, batch["input_ids"], batch["attention_mask"], batch["response_ids"])
        with torch.no_grad():
            ref_logp = sampled_logprobs(self.ref_model, batch["input_ids"], batch["attention_mask"], batch["response_ids"])
        return logp, ref_logp, batch["advantages"], batch["response_mask"].float()

    def update(self, batch):
        logp, ref_logp, advantages, mask = self._inputs(batch)
        # error: KL002
        value = penalised_surrogate(logp, ref_logp, advantages, mask)
        self.optimizer.zero_grad()
        value.backward()
        self.optimizer.step()
        return value.item()

    def update_accelerated(self, batch):
        logp, ref_logp, advantages, mask = self._inputs(batch)
        # error: KL001
        value = regularised_pg(logp, ref_logp, advantages, mask)
        self.accelerator.backward(value)
        self.optimizer.step()
        self.optimizer.zero_grad()

    def update_kl_to_go(self, batch):
        logp, ref_logp, advantages, mask = self._inputs(batch)
        # ok: KL001, KL002, KL003, KL004, KL005, KL006
        value = kl_to_go_surrogate(logp, ref_logp, advantages, mask)
        value.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
