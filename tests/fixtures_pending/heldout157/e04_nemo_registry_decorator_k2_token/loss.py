# Part of e04 (see __init__.py).
# Verdict: bug, KL003, on the self.kl_fn(...) call in ClippedPGLossFn.__call__.
from typing import Any, Dict, Optional

import torch

from nemo_rl.algorithms.interfaces import LossFunction
from nemo_rl.distributed.batched_data_dict import BatchedDataDict

from .registry import get_kl_fn

DEFAULT_LOSS_CONFIG: Dict[str, Any] = {
    "reference_policy_kl_penalty": 0.01,
    "kl_type": "k2",
    "ratio_clip_min": 0.2,
    "ratio_clip_max": 0.2,
    "token_level_loss": False,
}


class ClippedPGLossFn:
    def __init__(self, cfg: Optional[Dict[str, Any]] = None):
        cfg = {**DEFAULT_LOSS_CONFIG, **(cfg or {})}
        self.reference_policy_kl_penalty = cfg["reference_policy_kl_penalty"]
        self.ratio_clip_min = cfg["ratio_clip_min"]
        self.ratio_clip_max = cfg["ratio_clip_max"]
        self.kl_fn = get_kl_fn(cfg["kl_type"])

    def __call__(self, curr_logprobs, prev_logprobs, reference_logprobs, advantages, token_mask):
        metrics = {}
        ratios = (curr_logprobs - prev_logprobs).exp()
        clipped = ratios.clamp(1.0 - self.ratio_clip_min, 1.0 + self.ratio_clip_max)
        pg = -torch.min(ratios * advantages, clipped * advantages)
        loss = (pg * token_mask).sum(-1).mean()
        if self.reference_policy_kl_penalty != 0:
            # error: KL003
            kl = self.kl_fn(curr_logprobs, reference_logprobs, token_mask)
            kl_loss = kl.sum(-1).mean()
            loss = loss + self.reference_policy_kl_penalty * kl_loss
            metrics["kl_penalty"] = kl_loss.item()
        metrics["loss"] = loss.item()
        return loss, metrics


def train_step(policy_model, optimizer, data: BatchedDataDict, loss_fn: ClippedPGLossFn):
    logits = policy_model(data["input_ids"]).logits[:, :-1]
    curr_logprobs = torch.gather(logits.log_softmax(-1), 2, data["input_ids"][:, 1:].unsqueeze(-1)).squeeze(-1)
    loss, metrics = loss_fn(
        curr_logprobs,
        data["prev_logprobs"],
        data["reference_policy_logprobs"],
        data["advantages"],
        data["token_mask"],
    )
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return metrics
