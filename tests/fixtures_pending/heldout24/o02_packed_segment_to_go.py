"""Clipped policy-gradient loss over packed sequences (NeMo-RL style).

Sequences of a micro-batch are packed back to back into one row; ``cu_seqlens``
holds the segment boundaries. The loss is normalised by the number of valid
tokens of the whole global batch (``global_valid_toks``), so micro-batches can
be accumulated without re-weighting.
"""

from typing import Any, TypedDict

import torch


class ClippedPGLossConfig(TypedDict):
    reference_policy_kl_penalty: float
    ratio_clip_min: float
    ratio_clip_max: float
    use_on_policy_kl_approximation: bool


def calculate_kl_penalty_joschu2020(logprobs_policy: torch.Tensor, logprobs_reference: torch.Tensor) -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimate of Schulman (2020), always >= 0."""
    r = torch.clamp(logprobs_reference - logprobs_policy, min=-20.0, max=20.0)
    return torch.exp(r) - r - 1


def segment_ids(cu_seqlens: torch.Tensor) -> torch.Tensor:
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    return torch.repeat_interleave(torch.arange(lengths.numel(), device=cu_seqlens.device), lengths)


def packed_token_logprobs(next_token_logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    logprobs = torch.nn.functional.log_softmax(next_token_logits.float(), dim=-1)
    return torch.gather(logprobs, dim=-1, index=input_ids.unsqueeze(-1)).squeeze(-1)


class ClippedPGLossFn:
    def __init__(self, cfg: ClippedPGLossConfig):
        self.reference_policy_kl_penalty = cfg["reference_policy_kl_penalty"]
        self.ratio_clip_min = cfg["ratio_clip_min"]
        self.ratio_clip_max = cfg["ratio_clip_max"]

    def __call__(
        self,
        next_token_logits: torch.Tensor,
        data: dict[str, Any],
        global_valid_toks: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        cu_seqlens = data["cu_seqlens"]
        seg = segment_ids(cu_seqlens)
        token_mask = data["token_mask"] * data["sample_mask"][seg]
        advantages = data["advantages"]
        prev_logprobs = data["prev_logprobs"]
        reference_policy_logprobs = data["reference_policy_logprobs"]

        curr_logprobs = packed_token_logprobs(next_token_logits, data["input_ids"])

        log_ratios = curr_logprobs - prev_logprobs
        ratios = log_ratios.exp()
        ratios_clamped = ratios.clamp(1.0 - self.ratio_clip_min, 1.0 + self.ratio_clip_max)
        loss1 = -advantages * ratios
        loss2 = -advantages * ratios_clamped
        actor_loss = (torch.max(loss1, loss2) * token_mask).sum() / global_valid_toks

        if self.reference_policy_kl_penalty != 0:
            # keep the k3 value for logging; its gradient is the reward-to-go of the
            # log-ratio within each packed segment (the sequence KL's gradient)
            log_ratio = (curr_logprobs - reference_policy_logprobs).detach() * token_mask
            csum = log_ratio.cumsum(dim=0)
            seg_total = csum[cu_seqlens[1:] - 1]
            kl_to_go = seg_total[seg] - csum + log_ratio
            # ok: KL002
            kl_value = calculate_kl_penalty_joschu2020(logprobs_policy=curr_logprobs, logprobs_reference=reference_policy_logprobs).detach()
            kl = kl_value + kl_to_go * (curr_logprobs - curr_logprobs.detach())
            kl = self.reference_policy_kl_penalty * (kl * token_mask).sum() / global_valid_toks
        else:
            kl = torch.zeros((), device=curr_logprobs.device)

        loss = actor_loss + kl
        metrics = {
            "loss": loss.item(),
            "actor_loss": actor_loss.item(),
            "kl_penalty": kl.item(),
            "num_valid_samples": data["sample_mask"].sum().item(),
        }
        return loss, metrics
