"""An oat-style PPO/GRPO learner whose token aggregation is chosen once, in ``_init``.

Dr.GRPO sums each response's tokens and divides by a constant (the generation budget);
otherwise each response's tokens are averaged. The choice is stored as a callable,
``self.masked_aggregator``, and applied later to the policy-gradient and KL terms.

- k3 ("kl3") as a loss through the aggregator: KL002 whichever aggregator was chosen;
- the log-ratio of whole responses in the reward (no gradient), with a group baseline:
  the score-function form of the sequence KL, quiet.

Fixture: parsed by the tests, never executed.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch


@dataclass
class PPOArgs:
    critic_type: str = "drgrpo"
    beta: float = 0.001
    kl_in_reward: bool = False
    num_samples: int = 8
    generate_max_length: int = 1024
    cliprange: float = 0.2


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis=None, constant_normalizer: float = 1.0) -> torch.Tensor:
    if axis is None:
        return (values * mask).sum() / constant_normalizer
    return (values * mask).sum(axis=axis) / constant_normalizer


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis=None) -> torch.Tensor:
    if axis is None:
        return (values * mask).sum() / mask.sum()
    return (values * mask).sum(axis=axis) / mask.sum(axis=axis)


class PPOLearner:
    def __init__(self, args: PPOArgs, model, ref_model, optimizer):
        self.args = args
        self.model = model
        self.ref_model = ref_model
        self.optimizer = optimizer
        self._init(args)

    def _init(self, args: PPOArgs) -> None:
        if args.critic_type == "drgrpo":
            self.masked_aggregator = functools.partial(masked_sum, constant_normalizer=args.generate_max_length)
        else:
            self.masked_aggregator = masked_mean

    def _logps(self, model, input_ids, att_mask, response_mask):
        logits = model(input_ids, attention_mask=att_mask).logits[:, :-1].float()
        labels = input_ids[:, 1:]
        logps = torch.gather(logits.log_softmax(-1), 2, labels.unsqueeze(-1)).squeeze(-1)
        return logps[:, -response_mask.shape[1] :]

    @torch.no_grad()
    def compute_advantages(self, batch):
        rewards = batch["rewards"]
        if self.args.kl_in_reward:
            logps = self._logps(self.model, batch["input_ids"], batch["att_mask"], batch["response_mask"])
            ref_logps = self._logps(self.ref_model, batch["input_ids"], batch["att_mask"], batch["response_mask"])
            # ok: KL001, KL002, KL003, KL004, KL005, KL006
            seq_log_ratio = ((logps - ref_logps) * batch["response_mask"]).sum(-1)
            rewards = rewards - self.args.beta * seq_log_ratio
        grouped = rewards.view(-1, self.args.num_samples)
        advantages = grouped - grouped.mean(-1, keepdim=True)
        if self.args.critic_type != "drgrpo":
            advantages = advantages / (grouped.std(-1, keepdim=True) + 1e-8)
        return advantages.view(-1)

    def learning_step(self, batch):
        response_mask = batch["response_mask"]
        advantages = self.compute_advantages(batch)
        logps = self._logps(self.model, batch["input_ids"], batch["att_mask"], response_mask)
        old_logps = batch["logps"]
        ratio = torch.exp(logps - old_logps)
        surr1 = ratio * advantages[:, None]
        surr2 = ratio.clamp(1 - self.args.cliprange, 1 + self.args.cliprange) * advantages[:, None]
        pg_loss = self.masked_aggregator(-torch.min(surr1, surr2), response_mask, axis=1).mean()

        infos = {"pg_loss": pg_loss.detach()}
        loss = pg_loss
        if self.args.beta > 0 and not self.args.kl_in_reward:
            ref_logps = batch["ref_logps"]
            log_ratio = ref_logps - logps
            # error: KL002
            kl3 = torch.exp(log_ratio) - log_ratio - 1
            kl_loss = self.masked_aggregator(kl3, response_mask, axis=1).mean()
            loss = loss + self.args.beta * kl_loss
            infos["kl3"] = kl_loss.detach()

        self.optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        return infos
