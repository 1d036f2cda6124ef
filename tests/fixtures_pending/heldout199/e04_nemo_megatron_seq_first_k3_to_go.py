# Reviewer: NeMo-RL-style loss function for the Megatron backend, where every
# tensor is sequence-first [S, B]. The per-token k3 is written as
# r - log(r) - 1 with r = pi_ref / pi = exp(ref - logp), WITH its gradient. Its
# "to-go" is taken along dim 0 (the time axis here, so the flip axis is right),
# and row 0 - the whole response - is used as the KL loss. That is just the sum
# over tokens of per-token k3: expected gradient sum_t (1 - exp(-logr_t))
# grad logp_t, the token-level gradient of KL(pi_ref||pi).
# Verdict: bug, KL002, reported on the line that computes k3.
from typing import Any

import torch

from megatron.core import parallel_state
from nemo_rl.algorithms.interfaces import LossFunction, LossType
from nemo_rl.distributed.batched_data_dict import BatchedDataDict


class SeqFirstClippedPGLossFn(LossFunction):
    loss_type = LossType.SEQUENCE_LEVEL

    def __init__(self, cfg: dict[str, Any]):
        self.ratio_clip_min = cfg.get("ratio_clip_min", 0.2)
        self.ratio_clip_max = cfg.get("ratio_clip_max", 0.2)
        self.reference_policy_kl_penalty = cfg.get("reference_policy_kl_penalty", 0.01)

    def __call__(self, curr_logprobs, data: BatchedDataDict):
        # Megatron layout: [S, B]
        prev_logprobs = data["prev_logprobs"]
        reference_logprobs = data["reference_policy_logprobs"]
        advantages = data["advantages"]
        mask = data["token_mask"]
        return self.loss_sb(curr_logprobs, prev_logprobs, reference_logprobs, advantages, mask)

    def loss_sb(self, curr_logprobs, prev_logprobs, reference_logprobs, advantages, mask):
        ratios = torch.exp(curr_logprobs - prev_logprobs)
        ratios_clamped = ratios.clamp(1.0 - self.ratio_clip_min, 1.0 + self.ratio_clip_max)
        pg = -torch.min(advantages * ratios, advantages * ratios_clamped)
        pg_loss = (pg * mask).sum(0).mean()

        ratio_ref = torch.exp(reference_logprobs - curr_logprobs)
        # error: KL002
        k3 = ratio_ref - torch.log(ratio_ref) - 1
        k3_to_go = torch.flip(torch.cumsum(torch.flip(k3 * mask, dims=(0,)), dim=0), dims=(0,))
        kl = k3_to_go[0].mean()

        loss = pg_loss + self.reference_policy_kl_penalty * kl
        metrics = {
            "loss": loss.item(),
            "kl_penalty": kl.item(),
            "approx_entropy": -(curr_logprobs.detach() * mask).sum(0).mean().item(),
        }
        return loss, metrics


def megatron_train_step(model, batch, loss_fn: SeqFirstClippedPGLossFn):
    if parallel_state.get_tensor_model_parallel_world_size() > 1:
        raise NotImplementedError("vocab-parallel log-probs not wired in this sketch")
    logits = model(batch["input_ids"].t().contiguous())  # [S, B, V]
    curr_logprobs = torch.gather(logits.log_softmax(-1), 2, batch["target_ids"].t().unsqueeze(-1)).squeeze(-1)
    loss, metrics = loss_fn(curr_logprobs, batch)
    loss.backward()
    return metrics
