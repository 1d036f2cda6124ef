"""REINFORCE trainer whose `old_model` is the frozen initial snapshot, i.e. the reference.

`self.old_model` is a deep copy of the policy taken once in `__init__`, frozen and
never refreshed, so `old_logps` are the *reference* log-probs, not the behaviour
policy's (the trainer is on-policy: one update per batch, no ratio). The drift
penalty sums (logps - old_logps) over the response with a `bmm` against the
mask and adds its batch mean to the REINFORCE loss.

Bug (KL001, at the `drift` line): that is the k1 estimate of KL(pi||pi_old)
differentiated as a loss. old_logps carry no gradient, so autograd gives
sum_t grad log pi(y_t|y_<t), whose expectation under y ~ pi is zero at every
position: the penalty never pulls the policy back toward the snapshot.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch


@dataclass
class ReinforceConfig:
    drift_coef: float = 0.1
    baseline_momentum: float = 0.9
    max_grad_norm: float = 1.0


class SnapshotReinforceTrainer:
    def __init__(self, model: torch.nn.Module, optimizer, cfg: ReinforceConfig):
        self.model = model
        self.old_model = copy.deepcopy(model).eval().requires_grad_(False)
        self.optimizer = optimizer
        self.cfg = cfg
        self.baseline = 0.0

    def _logps(self, model, input_ids, attention_mask, gen_len: int) -> torch.Tensor:
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -gen_len - 1 : -1]
        return logits.log_softmax(-1).gather(-1, input_ids[:, -gen_len:, None]).squeeze(-1)

    def step(self, input_ids, attention_mask, gen_mask, rewards) -> dict:
        gen_len = gen_mask.shape[1]
        logps = self._logps(self.model, input_ids, attention_mask, gen_len)
        with torch.no_grad():
            old_logps = self._logps(self.old_model, input_ids, attention_mask, gen_len)

        adv = rewards - self.baseline
        self.baseline = self.cfg.baseline_momentum * self.baseline + (1 - self.cfg.baseline_momentum) * rewards.mean().item()
        pg_loss = -(adv * (logps * gen_mask).sum(-1)).mean()

        # error: KL001
        drift = torch.bmm((logps - old_logps).unsqueeze(1), gen_mask.unsqueeze(-1)).view(-1)
        loss = pg_loss + self.cfg.drift_coef * drift.mean()

        self.optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
        self.optimizer.step()
        return {"loss": loss.item(), "drift": drift.mean().item()}
