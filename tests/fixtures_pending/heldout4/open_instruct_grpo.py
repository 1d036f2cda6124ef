"""An open-instruct-style GRPO learner: four KL estimators stacked, one picked by an index.

``kl_estimator`` indexes ``[kl1, kl2, kl3, kl4]`` (k1, k2, k3, importance-weighted k1);
the default, 2, is k3. Padding positions of the policy's log-probs are overwritten by a
helper written for the generator's (vLLM's) log-probs; filling padding does not change
whose log-probs they are, so they stay the policy's and keep their gradient.

- the k3 entry added to the per-token loss: KL002 (gradient of KL(pi_ref||pi));
- the same stack computed under no_grad for the logs only: quiet.

Fixture: parsed by the tests, never executed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

INVALID_LOGPROB = 1.0


@dataclass
class Args:
    beta: float = 0.05
    kl_estimator: Literal[0, 1, 2, 3] = 2
    clip_lower: float = 0.2
    clip_higher: float = 0.2
    temperature: float = 1.0
    masked_mean_axis: int | None = None
    num_mini_batches: int = 1


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    if axis is not None:
        return ((values * mask).sum(axis=axis) / mask.sum(axis=axis)).mean()
    return (values * mask).sum() / mask.sum()


def mask_logprobs(vllm_logprobs: torch.Tensor, response_mask: torch.Tensor, fill: float = INVALID_LOGPROB) -> torch.Tensor:
    """Overwrite the non-response positions (prompt and padding) with a fill value."""
    return torch.masked_fill(vllm_logprobs, ~response_mask, fill)


def forward_logprobs(model, query_responses, pad_token_id: int, temperature: float) -> torch.Tensor:
    attention_mask = query_responses != pad_token_id
    logits = model(input_ids=query_responses, attention_mask=attention_mask).logits[:, :-1]
    logits = logits / (temperature + 1e-7)
    labels = query_responses[:, 1:]
    logprobs = torch.log_softmax(logits, dim=-1)
    return torch.gather(logprobs, -1, labels.unsqueeze(-1)).squeeze(-1)


class PolicyTrainer:
    def __init__(self, args: Args, model, optimizer, pad_token_id: int):
        self.args = args
        self.model = model
        self.optimizer = optimizer
        self.pad_token_id = pad_token_id
        self.local_metrics = {}

    def train_minibatch(self, query_responses, response_masks, ref_logprobs, old_logprobs, advantages):
        args = self.args
        mb_response_masks_bool = response_masks[:, 1:].bool()
        new_logprobs = forward_logprobs(self.model, query_responses, self.pad_token_id, args.temperature)
        new_logprobs = mask_logprobs(new_logprobs, mb_response_masks_bool)
        mb_ref_logprob = mask_logprobs(ref_logprobs, mb_response_masks_bool)
        mb_old_logprobs = mask_logprobs(old_logprobs, mb_response_masks_bool)

        logprobs_diff = new_logprobs - mb_old_logprobs
        ratio = torch.exp(logprobs_diff)
        pg_losses = -advantages[:, 1:] * ratio
        pg_losses2 = -advantages[:, 1:] * torch.clamp(ratio, 1.0 - args.clip_lower, 1.0 + args.clip_higher)
        pg_loss_max = torch.max(pg_losses, pg_losses2)

        # Only the estimator the index selects reaches the loss (kl3 by default).
        # ok: KL001, KL003
        ref_logprobs_diff = (new_logprobs - mb_ref_logprob).clamp(-40.0, 40.0)
        # ok: KL001, KL003
        kl1 = ref_logprobs_diff
        # ok: KL001, KL003
        kl2 = (ref_logprobs_diff) ** 2 / 2
        # error: KL002
        kl3 = torch.expm1(-ref_logprobs_diff) + ref_logprobs_diff
        # ok: KL001, KL003
        kl4 = ratio * ref_logprobs_diff
        kl = torch.stack([kl1, kl2, kl3, kl4])[args.kl_estimator]
        loss = masked_mean(pg_loss_max + (args.beta * kl), mb_response_masks_bool, args.masked_mean_axis)
        loss = loss / args.num_mini_batches
        loss.backward()
        self.optimizer.step()

        with torch.no_grad():
            # ok: KL001, KL002, KL003, KL004, KL005, KL006
            kl_4BT = torch.stack([kl1, kl2, kl3, kl4])
            self.local_metrics["objective/kl_avg"] = masked_mean(kl_4BT, mb_response_masks_bool).float()
            self.local_metrics["loss/policy_avg"] = masked_mean(pg_loss_max, mb_response_masks_bool)
            self.local_metrics["val/ratio"] = masked_mean(ratio, mb_response_masks_bool)
        return loss.detach()

    def stats_only_minibatch(self, query_responses, response_masks, ref_logprobs, advantages):
        """KL is tracked but not trained on (beta = 0 runs): the estimators feed metrics only."""
        mb_response_masks_bool = response_masks[:, 1:].bool()
        new_logprobs = forward_logprobs(self.model, query_responses, self.pad_token_id, self.args.temperature)
        new_logprobs = mask_logprobs(new_logprobs, mb_response_masks_bool)
        ratio = torch.exp(new_logprobs - new_logprobs.detach())
        loss = masked_mean(-advantages[:, 1:] * ratio, mb_response_masks_bool)
        loss.backward()
        self.optimizer.step()
        with torch.no_grad():
            diff = new_logprobs - mask_logprobs(ref_logprobs, mb_response_masks_bool)
            # ok: KL001, KL002, KL003, KL004, KL005, KL006
            kl = torch.stack([diff, diff**2 / 2, torch.expm1(-diff) + diff, ratio * diff])[self.args.kl_estimator]
            self.local_metrics["objective/kl"] = masked_mean(kl, mb_response_masks_bool).item()
