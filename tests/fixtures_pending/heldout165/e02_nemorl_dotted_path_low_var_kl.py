# Reviewer: NeMo-RL-style clipped PG loss. The KL estimator class is named in the loss
# config by a dotted import string, "<module>.LowVarKL", resolved at run time by
# splitting on the last dot (rpartition) and importing the module. The default points
# at this file's LowVarKL, k3 spelled ratio - log(ratio) - 1 with ratio = pi_ref/pi. It
# enters the token-level loss with its gradient and is summed over tokens (normalised by
# a constant token count): the expected gradient is the token-level gradient of
# KL(pi_ref||pi), not grad KL(pi||pi_ref).
# Verdict: bug, KL002, reported on the `kl = self.kl_estimator(...)` call in __call__.
import importlib
from typing import Any

import torch

from nemo_rl.algorithms.interfaces import LossFunction
from nemo_rl.distributed.batched_data_dict import BatchedDataDict

DEFAULT_LOSS_CONFIG: dict[str, Any] = {
    "reference_policy_kl_penalty": 0.01,
    "ratio_clip_min": 0.2,
    "ratio_clip_max": 0.28,
    "kl_estimator": f"{__name__}.LowVarKL",
}


def locate(path: str):
    module_name, _, qualname = path.rpartition(".")
    if not module_name:
        raise ValueError(f"expected a dotted path, got {path!r}")
    return getattr(importlib.import_module(module_name), qualname)


class LogRatioKL:
    def __call__(self, logprobs, ref_logprobs, mask):
        # ok: KL001
        return logprobs - ref_logprobs


class LowVarKL:
    def __call__(self, logprobs, ref_logprobs, mask):
        ratio = torch.exp(ref_logprobs - logprobs)
        return ratio - torch.log(ratio) - 1


def masked_mean(values, mask, global_normalization_factor):
    return (values * mask).sum() / global_normalization_factor


class ClippedPGLossFn:  # implements LossFunction
    def __init__(self, cfg: dict[str, Any] = DEFAULT_LOSS_CONFIG):
        self.kl_coef = cfg["reference_policy_kl_penalty"]
        self.clip_min = cfg["ratio_clip_min"]
        self.clip_max = cfg["ratio_clip_max"]
        self.kl_estimator = locate(cfg["kl_estimator"])()

    def __call__(self, curr_logprobs, prev_logprobs, reference_logprobs, advantages, mask, global_valid_toks):
        ratios = (curr_logprobs - prev_logprobs).exp()
        loss1 = -advantages * ratios
        loss2 = -advantages * ratios.clamp(1.0 - self.clip_min, 1.0 + self.clip_max)
        actor_loss = masked_mean(torch.max(loss1, loss2), mask, global_valid_toks)
        # error: KL002
        kl = self.kl_estimator(curr_logprobs, reference_logprobs, mask)
        kl_loss = self.kl_coef * masked_mean(kl, mask, global_valid_toks)
        loss = actor_loss + kl_loss
        metrics = {"actor_loss": actor_loss.item(), "kl_penalty": kl_loss.item()}
        return loss, metrics


def train_step(policy, data: BatchedDataDict, loss_fn: ClippedPGLossFn, optimizer):
    curr_logprobs = policy.get_logprobs(data)["logprobs"]
    mask = data["token_mask"] * data["sample_mask"].unsqueeze(-1)
    global_valid_toks = mask.sum()
    loss, metrics = loss_fn(
        curr_logprobs,
        data["prev_logprobs"],
        data["reference_policy_logprobs"],
        data["advantages"],
        mask,
        global_valid_toks,
    )
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return metrics
