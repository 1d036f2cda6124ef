"""NeMo-RL-style clipped policy-gradient loss function with a sequence-level k2 KL.

The KL penalty is k2 of the *sequence* log-ratio: the per-token log-ratios
are summed over the response first, then squared.  Its gradient,
sum_t grad log pi(y_t) * sum_s logr_s, has the expectation of grad
KL(pi || pi_ref) of the response.
"""

from dataclasses import dataclass
from typing import Any, Dict, Tuple

import torch


@dataclass
class ClippedPGLossConfig:
    reference_policy_kl_penalty: float = 0.01
    ratio_clip_min: float = 0.2
    ratio_clip_max: float = 0.2
    token_level_loss: bool = True


def masked_mean(values: torch.Tensor, mask: torch.Tensor, global_normalization_factor: float) -> torch.Tensor:
    return (values * mask).sum() / global_normalization_factor


class ClippedPGLossFn:
    def __init__(self, cfg: ClippedPGLossConfig = ClippedPGLossConfig()):
        self.reference_policy_kl_penalty = cfg.reference_policy_kl_penalty
        self.ratio_clip_min = cfg.ratio_clip_min
        self.ratio_clip_max = cfg.ratio_clip_max

    def __call__(
        self,
        next_token_logits: torch.Tensor,
        data: Dict[str, torch.Tensor],
        global_valid_seqs: float,
        global_valid_toks: float,
    ) -> Tuple[torch.Tensor, Dict[str, Any]]:
        token_mask = data["token_mask"]
        sample_mask = data["sample_mask"]
        advantages = data["advantages"]
        prev_logprobs = data["prev_logprobs"]
        reference_policy_logprobs = data["reference_policy_logprobs"]

        next_token_logprobs = torch.log_softmax(next_token_logits.to(torch.float32), dim=-1)
        curr_logprobs = next_token_logprobs.gather(dim=-1, index=data["input_ids"].unsqueeze(-1)).squeeze(-1)

        ratios = (curr_logprobs - prev_logprobs).exp()
        ratios_clamped = ratios.clamp(1.0 - self.ratio_clip_min, 1.0 + self.ratio_clip_max)
        loss1 = -advantages * ratios
        loss2 = -advantages * ratios_clamped
        mask = token_mask * sample_mask.unsqueeze(-1)
        actor_loss = masked_mean(torch.max(loss1, loss2), mask, global_normalization_factor=global_valid_toks)

        seq_log_ratio = ((curr_logprobs - reference_policy_logprobs) * token_mask).sum(dim=-1)
        # ok: KL003
        seq_kl = 0.5 * seq_log_ratio.square()
        kl = (seq_kl * sample_mask).sum() / global_valid_seqs
        loss = actor_loss + self.reference_policy_kl_penalty * kl
        return loss, {"loss": loss.item(), "kl_penalty": kl.item(), "actor_loss": actor_loss.item()}


def train_microbatches(policy, optimizer, loss_fn: ClippedPGLossFn, microbatches, global_valid_seqs: float, global_valid_toks: float) -> float:
    optimizer.zero_grad()
    total = 0.0
    for mb in microbatches:
        response_len = mb["input_ids"].size(1)
        logits = policy(mb["full_input_ids"]).logits[:, -response_len - 1 : -1]
        loss, metrics = loss_fn(logits, mb, global_valid_seqs, global_valid_toks)
        loss.backward()
        total += metrics["loss"]
    optimizer.step()
    return total
