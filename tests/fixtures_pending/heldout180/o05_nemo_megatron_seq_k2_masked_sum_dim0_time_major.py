# Reviewer: NeMo-RL-style loss on the Megatron backend. Megatron keeps
# activations sequence-first, [S, B, V]; the token log-probs, reference
# log-probs and the token mask here stay time-major [T, B]. The default
# kl_type "seq_k2" is k2 of the SEQUENCE log-ratio, and masked_sum(..., dim=0)
# sums over dim 0 = TIME in this layout: 0.5 * (sum_t logr_t)^2 per sequence,
# gradient sum_t grad logp_t * sum_s logr_s, expectation grad KL(pi||pi_ref).
# The same line as in e05's ROLL worker is correct here because the axis is time.
# The per-sequence values are averaged over the batch (dim -1 after reduction).
# Verdict: correct. The dim=0 reduction is over time, not over the batch.
from typing import TypedDict

import torch

from megatron.core import parallel_state
from nemo_rl.algorithms.interfaces import LossFunction
from nemo_rl.distributed.batched_data_dict import BatchedDataDict


class ClippedPGLossConfig(TypedDict):
    reference_policy_kl_penalty: float
    kl_type: str
    ratio_clip: float


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int = None) -> torch.Tensor:
    if dim is None:
        return (values * mask).sum()
    return (values * mask).sum(dim=dim)


class MegatronClippedPGLossFn:
    """Loss on time-major tensors: every [T, B] tensor has time on dim 0."""

    def __init__(self, cfg: ClippedPGLossConfig):
        self.reference_policy_kl_penalty = cfg["reference_policy_kl_penalty"]
        self.kl_type = cfg["kl_type"]
        self.ratio_clip = cfg["ratio_clip"]

    def __call__(self, curr_logprobs, prev_logprobs, reference_logprobs, advantages, token_mask):
        # all inputs: [T, B]; advantages broadcast from [1, B]
        ratios = (curr_logprobs - prev_logprobs).exp()
        clipped = ratios.clamp(1 - self.ratio_clip, 1 + self.ratio_clip)
        pg = -torch.min(ratios * advantages, clipped * advantages)
        pg_loss = masked_sum(pg, token_mask, dim=0).mean()
        loss = pg_loss
        metrics = {"pg_loss": pg_loss.detach()}
        if self.reference_policy_kl_penalty != 0:
            log_ratio = curr_logprobs - reference_logprobs
            if self.kl_type == "seq_k2":
                # ok: KL003
                kl = 0.5 * masked_sum(log_ratio, token_mask, dim=0).square()
            else:
                # ok: KL003
                kl = masked_sum(0.5 * log_ratio.square(), token_mask, dim=0)
            kl_loss = kl.mean()
            loss = loss + self.reference_policy_kl_penalty * kl_loss
            metrics["kl_penalty"] = kl_loss.detach()
        return loss, metrics


def forward_step(batch: BatchedDataDict, model, loss_fn: MegatronClippedPGLossFn):
    logits = model(batch["input_ids"].t().contiguous())  # [S, B, V]
    tokens = batch["input_ids"].t()[1:]
    curr_logprobs = torch.gather(logits[:-1].log_softmax(-1), 2, tokens.unsqueeze(-1)).squeeze(-1)
    mask = batch["token_mask"].t()[1:].float()
    loss, metrics = loss_fn(curr_logprobs, batch["prev_logprobs"].t()[1:], batch["reference_policy_logprobs"].t()[1:],
                            batch["advantages"][None, :], mask)
    if parallel_state.get_data_parallel_rank() == 0:
        metrics = {k: v.item() for k, v in metrics.items()}
    return loss, metrics


DEFAULT_LOSS_CONFIG: ClippedPGLossConfig = {"reference_policy_kl_penalty": 0.2, "kl_type": "seq_k2", "ratio_clip": 0.2}
