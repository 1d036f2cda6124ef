"""KL terms built per micro-batch in comprehensions, then summed into one loss.

Long completions are split into micro-batches for the forward pass; the per-micro-batch
terms are collected in lists and reduced at the end, before one backward pass. The data
are the completions just sampled from the policy.

- GRPO's k3 per token, one tensor per micro-batch, token-averaged: KL002;
- 0.5 * (sum_t logr_t)**2 per completion (k2 of the sequence log-ratio): quiet.

Fixture: parsed by the tests, never executed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def token_logprobs(model, input_ids, attention_mask, completion_ids):
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    logits = logits[:, -completion_ids.shape[1] - 1 : -1]
    return torch.gather(F.log_softmax(logits.float(), dim=-1), 2, completion_ids.unsqueeze(-1)).squeeze(-1)


def split_batch(batch: dict, micro_batch_size: int) -> list[dict]:
    n = batch["input_ids"].shape[0]
    return [{k: v[i : i + micro_batch_size] for k, v in batch.items()} for i in range(0, n, micro_batch_size)]


class MicroBatchGRPO:
    def __init__(self, model, ref_model, optimizer, beta: float = 0.04, micro_batch_size: int = 4):
        self.model = model
        self.ref_model = ref_model
        self.optimizer = optimizer
        self.beta = beta
        self.micro_batch_size = micro_batch_size

    def _logps(self, mbs):
        logps = [token_logprobs(self.model, mb["input_ids"], mb["attention_mask"], mb["completion_ids"]) for mb in mbs]
        with torch.no_grad():
            ref_logps = [
                token_logprobs(self.ref_model, mb["input_ids"], mb["attention_mask"], mb["completion_ids"]) for mb in mbs
            ]
        return logps, ref_logps

    def train_step(self, batch):
        mbs = split_batch(batch, self.micro_batch_size)
        masks = [mb["completion_mask"] for mb in mbs]
        logps, ref_logps = self._logps(mbs)
        n_tokens = sum(m.sum() for m in masks)

        pg_terms = [
            -(mb["advantages"].unsqueeze(1) * torch.exp(lp - lp.detach()) * m).sum()
            for mb, lp, m in zip(mbs, logps, masks)
        ]
        # error: KL002
        kl_terms = [torch.exp(ref - lp) - (ref - lp) - 1 for lp, ref in zip(logps, ref_logps)]
        kl_sum = sum((kl * m).sum() for kl, m in zip(kl_terms, masks))
        loss = (sum(pg_terms) + self.beta * kl_sum) / n_tokens

        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {"loss": loss.item(), "kl": (kl_sum / n_tokens).item()}

    def train_step_sequence_kl(self, batch):
        mbs = split_batch(batch, self.micro_batch_size)
        masks = [mb["completion_mask"] for mb in mbs]
        logps, ref_logps = self._logps(mbs)

        pg_terms = [-(mb["advantages"] * (lp * m).sum(-1)).sum() for mb, lp, m in zip(mbs, logps, masks)]
        # ok: KL001, KL002, KL003, KL004, KL005, KL006
        seq_kls = [0.5 * ((lp - ref) * m).sum(-1).pow(2) for lp, ref, m in zip(logps, ref_logps, masks)]
        total = sum(pg_terms) + self.beta * sum(k.sum() for k in seq_kls)
        loss = total / batch["input_ids"].shape[0]

        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {"loss": loss.item()}

    def train_step_accumulate(self, batch):
        """Gradient accumulation: one backward per micro-batch, k3 per token in each."""
        mbs = split_batch(batch, self.micro_batch_size)
        for mb in mbs:
            mask = mb["completion_mask"]
            lp = token_logprobs(self.model, mb["input_ids"], mb["attention_mask"], mb["completion_ids"])
            with torch.no_grad():
                ref = token_logprobs(self.ref_model, mb["input_ids"], mb["attention_mask"], mb["completion_ids"])
            pg = -(mb["advantages"].unsqueeze(1) * torch.exp(lp - lp.detach()) * mask).sum() / mask.sum()
            # error: KL002
            kl = torch.exp(ref - lp) - (ref - lp) - 1
            mb_loss = pg + self.beta * (kl * mask).sum() / mask.sum()
            (mb_loss / len(mbs)).backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
