# Reviewer: a user's own GRPO trainer (TRL-like layout) that replaced the k3
# loss by the score-function KL with a "KL to go" weight, after reading that
# per-token KL terms are a partial gradient. The reverse cumulative sum is
# taken with `flip(0).cumsum(0).flip(0)`: over dim 0, the *batch* axis of the
# `[B, T]` log-ratio, not over time. Each token's weight is its own
# log-ratio plus the log-ratios of the same position in the later rows of the
# micro-batch (independent samples).
# Verdict: BUG (KL003). The other rows' log-ratios are independent of this
# row's score and drop out in expectation, so the term's expected gradient is
# E[sum_t logr_t grad logp_t]: the token-level partial gradient of the
# sequence KL(pi||pi_ref), with extra noise. The sum must run over dim -1.
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trl import GRPOConfig


@dataclass
class KLToGoConfig(GRPOConfig):
    beta: float = 0.04
    epsilon: float = 0.2
    max_completion_length: int = 256


def selective_log_softmax(logits, index):
    return torch.gather(F.log_softmax(logits, dim=-1), -1, index.unsqueeze(-1)).squeeze(-1)


def compute_grpo_loss(per_token_logps, old_per_token_logps, ref_per_token_logps, advantages,
                      completion_mask, beta, epsilon, max_completion_length):
    coef_1 = torch.exp(per_token_logps - old_per_token_logps)
    coef_2 = torch.clamp(coef_1, 1 - epsilon, 1 + epsilon)
    per_token_pg = -torch.min(coef_1 * advantages[:, None], coef_2 * advantages[:, None])

    # ok: KL001
    log_ratio = (per_token_logps - ref_per_token_logps).detach() * completion_mask
    kl_to_go = log_ratio.flip(0).cumsum(0).flip(0)
    # error: KL003
    kl_penalty = kl_to_go * per_token_logps
    per_token_loss = per_token_pg + beta * kl_penalty
    loss = (per_token_loss * completion_mask).sum() / (per_token_loss.size(0) * max_completion_length)

    with torch.no_grad():
        metrics = {
            "kl": ((log_ratio.sum(-1)).mean()).item(),
            "clip_ratio": ((coef_1 - coef_2).abs() > 0).float().mean().item(),
        }
    return loss, metrics


class KLToGoGRPOTrainer:
    def __init__(self, model, ref_model, args: KLToGoConfig):
        self.model, self.ref_model, self.args = model, ref_model, args

    def _logps(self, model, input_ids, attention_mask, logits_to_keep):
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        logits = logits[:, -logits_to_keep - 1 : -1, :]
        return selective_log_softmax(logits, input_ids[:, -logits_to_keep:])

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], completion_mask], dim=1)
        logits_to_keep = completion_ids.size(1)
        per_token_logps = self._logps(model, input_ids, attention_mask, logits_to_keep)
        with torch.no_grad():
            ref_per_token_logps = self._logps(self.ref_model, input_ids, attention_mask, logits_to_keep)
        old = inputs.get("old_per_token_logps")
        old = per_token_logps.detach() if old is None else old
        loss, _ = compute_grpo_loss(
            per_token_logps, old, ref_per_token_logps, inputs["advantages"], completion_mask,
            self.args.beta, self.args.epsilon, self.args.max_completion_length,
        )
        return loss
