"""Clipped policy-gradient loss in the style of NeMo-RL's ``ClippedPGLossFn``.

The KL(pi || pi_ref) penalty is k2 of the response's summed log-ratio; a
shared helper returns the sequence KL terms as a dict, and the loss takes the
entry it needs. The same helper, on the sampling policy's log-probs, gives a
logged metric: the KL of the rollout policy to the reference.
"""

from typing import Any, Dict, List, Optional, Tuple, TypedDict

import torch


class ClippedPGLossConfig(TypedDict):
    reference_policy_kl_penalty: float
    ratio_clip_min: float
    ratio_clip_max: float


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: Optional[int] = None) -> torch.Tensor:
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp(min=1)
    return (values * mask).sum(dim=dim) / mask.sum(dim=dim).clamp(min=1)


def kl_terms(logprobs: torch.Tensor, reference_logprobs: torch.Tensor, mask: torch.Tensor) -> Dict[str, torch.Tensor]:
    """Sequence KL(pi || pi_ref) of each response: the k1 value (logged) and k2 of the summed log-ratio (the penalty)."""
    seq_log_ratio = ((logprobs - reference_logprobs) * mask).sum(dim=-1)
    return {"seq_k1": seq_log_ratio, "seq_k2": 0.5 * seq_log_ratio.square()}


class ClippedPGLossFn:
    def __init__(self, cfg: ClippedPGLossConfig):
        self.reference_policy_kl_penalty = cfg["reference_policy_kl_penalty"]
        self.ratio_clip_min = cfg["ratio_clip_min"]
        self.ratio_clip_max = cfg["ratio_clip_max"]

    def __call__(self, next_token_logits: torch.Tensor, data: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, Dict[str, Any]]:
        token_mask = data["token_mask"]
        curr_logprobs = torch.log_softmax(next_token_logits, dim=-1).gather(-1, data["response_ids"].unsqueeze(-1)).squeeze(-1)
        prev_logprobs = data["prev_logprobs"]
        advantages = data["advantages"]

        ratios = (curr_logprobs - prev_logprobs).exp()
        ratios_clamped = ratios.clamp(1.0 - self.ratio_clip_min, 1.0 + self.ratio_clip_max)
        pg_loss = masked_mean(-torch.min(ratios * advantages, ratios_clamped * advantages), token_mask)

        # ok: KL001, KL003
        kl = kl_terms(curr_logprobs, data["reference_policy_logprobs"], token_mask)["seq_k2"]
        loss = pg_loss + self.reference_policy_kl_penalty * kl.mean()

        with torch.no_grad():
            # ok: KL001, KL005
            sampling_kl = kl_terms(prev_logprobs, data["reference_policy_logprobs"], token_mask)["seq_k1"]
            metrics = {
                "loss": loss.item(),
                "kl_penalty": kl.mean().item(),
                "sampling_kl": sampling_kl.mean().item(),
                "probs_ratio": masked_mean(ratios, token_mask).item(),
            }
        return loss, metrics


def train_microbatches(policy, loss_fn: ClippedPGLossFn, optimizer, microbatches: List[Dict[str, torch.Tensor]]) -> List[Dict[str, Any]]:
    optimizer.zero_grad()
    all_metrics = []
    for mb in microbatches:
        response_length = mb["response_ids"].size(1)
        logits = policy(mb["input_ids"]).logits[:, -response_length - 1 : -1]
        loss, metrics = loss_fn(logits, mb)
        (loss / len(microbatches)).backward()
        all_metrics.append(metrics)
    optimizer.step()
    return all_metrics
