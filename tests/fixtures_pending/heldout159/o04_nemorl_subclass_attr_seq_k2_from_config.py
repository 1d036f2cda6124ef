# Reviewer: same NeMo-RL-style skeleton as e04: the KL estimator is a class
# attribute overridden by subclasses, and `ClippedPGLossFn.from_config(cfg)`
# returns the class whose attribute matches cfg["kl_estimator"]. Here the base
# class says `kl_estimator = "k3"`, but the default configuration asks for
# "seq_k2", which selects SequenceKLLossFn: `_kl` returns
# 0.5 * (sum_t mask_t * logr_t)^2 per sequence, whose gradient is exactly
# grad KL(pi||pi_ref) of the sequence. The k3 branch never runs by default.
# Verdict: correct. The k3 branch and the call in __call__ stay silent.
from typing import Any, Dict, Optional, TypedDict

import torch

from nemo_rl.algorithms.utils import masked_mean
from nemo_rl.distributed.batched_data_dict import BatchedDataDict


class ClippedPGLossConfig(TypedDict, total=False):
    reference_policy_kl_penalty: float
    ratio_clip_min: float
    ratio_clip_max: float
    kl_estimator: str


DEFAULT_LOSS_CONFIG: ClippedPGLossConfig = {
    "reference_policy_kl_penalty": 0.01,
    "ratio_clip_min": 0.2,
    "ratio_clip_max": 0.2,
    "kl_estimator": "seq_k2",
}


class ClippedPGLossFn:
    kl_estimator: str = "k3"

    def __init__(self, cfg: ClippedPGLossConfig):
        self.kl_penalty = cfg["reference_policy_kl_penalty"]
        self.clip_min = cfg["ratio_clip_min"]
        self.clip_max = cfg["ratio_clip_max"]

    @classmethod
    def from_config(cls, cfg: Optional[Dict[str, Any]] = None) -> "ClippedPGLossFn":
        cfg = {**DEFAULT_LOSS_CONFIG, **(cfg or {})}
        for klass in (cls, *cls.__subclasses__()):
            if klass.kl_estimator == cfg["kl_estimator"]:
                return klass(cfg)
        raise ValueError(f"no loss function for kl_estimator={cfg['kl_estimator']}")

    def _kl(self, curr_logprobs, ref_logprobs, mask):
        """Per-sequence KL term, shape [batch]."""
        log_ratio = curr_logprobs - ref_logprobs
        if self.kl_estimator == "seq_k2":
            return 0.5 * (log_ratio * mask).sum(-1).pow(2)
        if self.kl_estimator == "k3":
            # ok: KL002
            per_token = torch.exp(-log_ratio) + log_ratio - 1
            return (per_token * mask).sum(-1)
        raise NotImplementedError(self.kl_estimator)

    def __call__(self, next_token_logprobs: torch.Tensor, data: BatchedDataDict):
        mask = data["token_mask"]
        advantages = data["advantages"]
        prev_logprobs = data["prev_logprobs"]
        ref_logprobs = data["reference_policy_logprobs"]
        curr_logprobs = next_token_logprobs

        ratios = (curr_logprobs - prev_logprobs).exp()
        ratios_clamped = ratios.clamp(1.0 - self.clip_min, 1.0 + self.clip_max)
        loss1 = -advantages * ratios
        loss2 = -advantages * ratios_clamped
        actor_loss = (torch.max(loss1, loss2) * mask).sum(-1).mean()

        loss = actor_loss
        if self.kl_penalty > 0:
            # ok: KL002
            kl = self._kl(curr_logprobs, ref_logprobs, mask)
            loss = loss + self.kl_penalty * kl.mean()
        with torch.no_grad():
            probs_ratio = ((ratios.detach() * mask).sum() / mask.sum()).item()
        return loss, {"loss": loss.item(), "probs_ratio": probs_ratio}


class SequenceKLLossFn(ClippedPGLossFn):
    """KL of the whole response: k2 of the summed log-ratio."""

    kl_estimator = "seq_k2"


def grpo_train_step(policy, batch: BatchedDataDict, loss_cfg: Optional[Dict[str, Any]] = None):
    loss_fn = ClippedPGLossFn.from_config(loss_cfg)
    logprobs = policy.get_logprobs(batch)["logprobs"]
    loss, metrics = loss_fn(logprobs, batch)
    loss.backward()
    return metrics
