"""KL helpers as static methods of a utility class, and policy log-probs passed inline.

``KLUtils.compute_kl`` defaults to the low-variance (k3) estimator. The trainer sometimes
passes the policy's log-probs as a call expression (``self.logprobs(model, batch)``)
rather than a named variable: its origin is the policy model, so it carries gradient.

- ``KLUtils.compute_kl(logp, ref)`` in the loss (default k3): KL002;
- ``compute_kl(self.logprobs(self.model, batch), ref)`` (module-level, k1 default): KL001;
- ``KLUtils.compute_kl(..., kl_type="k1")`` under no_grad, in the rewards, credited by a
  reverse cumulative sum (returns): quiet;
- ``KLUtils.sequence_k2(self.logprobs(...), ref, mask)``: k2 of the sequence log-ratio: quiet.

Fixture: parsed by the tests, never executed.
"""

from __future__ import annotations

import torch


class KLUtils:
    @staticmethod
    def compute_kl(logp: torch.Tensor, ref_logp: torch.Tensor, kl_type: str = "low_var_kl") -> torch.Tensor:
        if kl_type == "k1":
            return logp - ref_logp
        if kl_type == "k2":
            return 0.5 * (logp - ref_logp) ** 2
        if kl_type == "low_var_kl":
            ratio = torch.exp(ref_logp - logp)
            return ratio - torch.log(ratio) - 1
        raise ValueError(kl_type)

    @staticmethod
    def sequence_k2(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return 0.5 * ((logp - ref_logp) * mask).sum(-1).pow(2)

    @staticmethod
    def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return (x * mask).sum() / mask.sum()


def compute_kl(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k1") -> torch.Tensor:
    return KLUtils.compute_kl(logp, ref_logp, kl_type=kind)


class ReinforceTrainer:
    def __init__(self, model, ref_model, optimizer, beta: float = 0.05):
        self.model = model
        self.ref_model = ref_model
        self.optimizer = optimizer
        self.beta = beta

    def logprobs(self, model, batch):
        logits = model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        logits = logits[:, -batch["response_ids"].size(1) - 1 : -1].float()
        return torch.gather(logits.log_softmax(-1), -1, batch["response_ids"].unsqueeze(-1)).squeeze(-1)

    @torch.no_grad()
    def ref_logprobs(self, batch):
        return self.logprobs(self.ref_model, batch)

    def _step(self, loss):
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def step_k3_loss(self, batch):
        mask = batch["response_mask"]
        logp = self.logprobs(self.model, batch)
        ref_logp = self.ref_logprobs(batch)
        pg_loss = -(batch["advantages"] * (logp * mask).sum(-1)).mean()
        # error: KL002
        kl = KLUtils.compute_kl(logp, ref_logp)
        return self._step(pg_loss + self.beta * KLUtils.masked_mean(kl, mask))

    def step_inline_logprobs(self, batch):
        mask = batch["response_mask"]
        ref_logp = self.ref_logprobs(batch)
        pg_loss = -(batch["advantages"] * (self.logprobs(self.model, batch) * mask).sum(-1)).mean()
        # error: KL001
        kl = compute_kl(self.logprobs(self.model, batch), ref_logp)
        return self._step(pg_loss + self.beta * KLUtils.masked_mean(kl, mask))

    def step_sequence_k2(self, batch):
        mask = batch["response_mask"]
        ref_logp = self.ref_logprobs(batch)
        logp = self.logprobs(self.model, batch)
        pg_loss = -(batch["advantages"] * (logp * mask).sum(-1)).mean()
        # ok: KL001, KL002, KL003, KL004, KL005, KL006
        seq_kl = KLUtils.sequence_k2(self.logprobs(self.model, batch), ref_logp, mask)
        return self._step(pg_loss + self.beta * seq_kl.mean())

    def step_kl_reward(self, batch):
        mask = batch["response_mask"]
        logp = self.logprobs(self.model, batch)
        with torch.no_grad():
            # ok: KL001, KL002, KL003, KL004, KL005, KL006
            kl = KLUtils.compute_kl(logp, self.ref_logprobs(batch), kl_type="k1")
            rewards = -self.beta * kl * mask
            rewards[:, -1] += batch["scores"]
            returns = rewards.flip(-1).cumsum(-1).flip(-1)
        return self._step(-(returns * logp * mask).sum(-1).mean())
