# Reviewer: a NeMo-RL-style loss module with the three losses one recipe uses:
# NLL for SFT, DPO (with an SFT auxiliary) for preference pairs, and the
# clipped policy-gradient loss for GRPO with a reference-policy KL penalty.
# DPO's log-ratio to the reference is its implicit reward, not a KL term. In
# ClippedPGLossFn the Joschu k3 penalty is computed from data["prev_logprobs"]
# (the generation-time log-probs, stored without gradient) instead of the
# current log-probs: the KL term added to the loss is a constant for autograd.
# Verdict: bug, KL005, at the calculate_kl_penalty_joschu2020 call.
from typing import TypedDict

import torch
import torch.nn.functional as F

from nemo_rl.algorithms.interfaces import LossFunction, LossType
from nemo_rl.distributed.batched_data_dict import BatchedDataDict


class ClippedPGLossConfig(TypedDict):
    reference_policy_kl_penalty: float
    ratio_clip_min: float
    ratio_clip_max: float


DEFAULT_PG_CONFIG: ClippedPGLossConfig = {
    "reference_policy_kl_penalty": 0.01,
    "ratio_clip_min": 0.2,
    "ratio_clip_max": 0.28,
}


def masked_mean(values, mask, global_normalization_factor=None):
    denom = global_normalization_factor if global_normalization_factor is not None else mask.sum()
    return (values * mask).sum() / denom


def calculate_kl_penalty_joschu2020(logprobs_policy, logprobs_reference):
    r = logprobs_reference - logprobs_policy
    return torch.exp(r) - r - 1


class NLLLoss(LossFunction):
    loss_type = LossType.TOKEN_LEVEL

    def __call__(self, curr_logprobs, data: BatchedDataDict, global_valid_toks):
        mask = data["token_mask"] * data["sample_mask"].unsqueeze(-1)
        loss = -masked_mean(curr_logprobs, mask, global_valid_toks)
        return loss, {"loss": loss.item(), "num_unmasked_tokens": mask.sum().item()}


class DPOLossFn(LossFunction):
    loss_type = LossType.SEQUENCE_LEVEL

    def __init__(self, reference_policy_kl_penalty=0.05, sft_loss_weight=0.1, preference_average_log_probs=False):
        self.reference_policy_kl_penalty = reference_policy_kl_penalty
        self.sft_loss_weight = sft_loss_weight
        self.preference_average_log_probs = preference_average_log_probs

    def __call__(self, curr_logprobs, data: BatchedDataDict, global_valid_seqs):
        mask = data["token_mask"] * data["sample_mask"].unsqueeze(-1)
        seq_logprobs = (curr_logprobs * mask).sum(-1)
        ref_seq_logprobs = (data["reference_policy_logprobs"] * mask).sum(-1)
        if self.preference_average_log_probs:
            seq_logprobs = seq_logprobs / mask.sum(-1).clamp(min=1)
            ref_seq_logprobs = ref_seq_logprobs / mask.sum(-1).clamp(min=1)
        # ok: KL001
        rewards = self.reference_policy_kl_penalty * (seq_logprobs - ref_seq_logprobs)
        rewards_chosen, rewards_rejected = rewards[::2], rewards[1::2]
        preference_loss = -F.logsigmoid(rewards_chosen - rewards_rejected).sum() / global_valid_seqs
        sft_loss = -seq_logprobs[::2].sum() / global_valid_seqs
        loss = preference_loss + self.sft_loss_weight * sft_loss
        accuracy = (rewards_chosen > rewards_rejected).float().mean()
        return loss, {"preference_loss": preference_loss.item(), "sft_loss": sft_loss.item(), "accuracy": accuracy.item()}


class ClippedPGLossFn(LossFunction):
    loss_type = LossType.TOKEN_LEVEL

    def __init__(self, cfg: ClippedPGLossConfig = DEFAULT_PG_CONFIG):
        self.reference_policy_kl_penalty = cfg["reference_policy_kl_penalty"]
        self.ratio_clip_min = cfg["ratio_clip_min"]
        self.ratio_clip_max = cfg["ratio_clip_max"]

    def __call__(self, curr_logprobs, data: BatchedDataDict, global_valid_toks):
        token_mask = data["token_mask"][:, 1:]
        mask = token_mask * data["sample_mask"].unsqueeze(-1)
        advantages = data["advantages"][:, 1:]
        prev_logprobs = data["prev_logprobs"][:, 1:]
        reference_policy_logprobs = data["reference_policy_logprobs"][:, 1:]

        if self.reference_policy_kl_penalty != 0:
            # error: KL005
            kl = calculate_kl_penalty_joschu2020(logprobs_policy=prev_logprobs, logprobs_reference=reference_policy_logprobs)
            kl = self.reference_policy_kl_penalty * masked_mean(kl, mask, global_valid_toks)
        else:
            kl = torch.tensor(0.0)

        ratios = (curr_logprobs - prev_logprobs).exp()
        ratios_clamped = ratios.clamp(1.0 - self.ratio_clip_min, 1.0 + self.ratio_clip_max)
        loss1 = -advantages * ratios
        loss2 = -advantages * ratios_clamped
        actor_loss = masked_mean(torch.max(loss1, loss2), mask, global_valid_toks)
        loss = actor_loss + kl
        with torch.no_grad():
            probs_ratio = masked_mean(ratios.detach(), mask, global_valid_toks).item()
        return loss, {"loss": loss.item(), "kl_penalty": kl.item(), "probs_ratio": probs_ratio}


def train_microbatch(policy_model, batch: BatchedDataDict, loss_fn: LossFunction, optimizer, normalizer):
    logits = policy_model(batch["input_ids"]).logits.float()
    logprobs = torch.gather(logits.log_softmax(-1)[:, :-1], -1, batch["input_ids"][:, 1:].unsqueeze(-1)).squeeze(-1)
    if isinstance(loss_fn, ClippedPGLossFn):
        curr_logprobs = logprobs
    else:
        curr_logprobs = F.pad(logprobs, (1, 0))
    loss, metrics = loss_fn(curr_logprobs, batch, normalizer)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return metrics


def build_loss_fns():
    return {"sft": NLLLoss(), "dpo": DPOLossFn(), "grpo": ClippedPGLossFn()}
