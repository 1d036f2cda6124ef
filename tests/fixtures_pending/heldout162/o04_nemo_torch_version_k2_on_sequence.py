# Reviewer: NeMo-RL-style ClippedPG loss, same skeleton as e04: _kl_penalty is
# defined twice under a torch version check. Here torch >= 2.1 (any current
# install) gets the k2 branch, 0.5 * x**2, and the loss applies it to the
# SEQUENCE log-ratio (masked sum over tokens taken before the call): its
# gradient is exactly grad KL(pi||pi_ref) of the sequence. The expm1 k3 branch
# is the legacy torch < 2.1 path and never runs.
# Verdict: correct. The legacy k3 body and the _kl_penalty call stay silent.
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from packaging.version import Version

if TYPE_CHECKING:
    from nemo_rl.algorithms.interfaces import LossFunction
    from nemo_rl.distributed.batched_data_dict import BatchedDataDict

_TORCH_VERSION = Version(torch.__version__.split("+")[0])

if _TORCH_VERSION >= Version("2.1"):

    def _kl_penalty(log_ratio: torch.Tensor) -> torch.Tensor:
        return 0.5 * log_ratio.pow(2)

else:

    def _kl_penalty(log_ratio: torch.Tensor) -> torch.Tensor:
        # old torch: no bf16 expm1 kernel, keep the exp form
        # ok: KL002
        return torch.expm1(-log_ratio) + log_ratio


class ClippedPGLossFn:
    """Implements LossFunction; see nemo_rl.algorithms.interfaces."""

    def __init__(self, cfg: dict[str, Any]):
        self.ratio_clip_min = cfg.get("ratio_clip_min", 0.2)
        self.ratio_clip_max = cfg.get("ratio_clip_max", 0.2)
        self.reference_policy_kl_penalty = cfg.get("reference_policy_kl_penalty", 0.01)

    def __call__(self, curr_logprobs: torch.Tensor, data: "BatchedDataDict") -> tuple[torch.Tensor, dict]:
        token_mask = data["token_mask"]
        prev_logprobs = data["prev_logprobs"]
        ref_logprobs = data["reference_policy_logprobs"]
        advantages = data["advantages"]
        num_seqs = token_mask.shape[0]

        ratios = (curr_logprobs - prev_logprobs).exp()
        clipped = ratios.clamp(1.0 - self.ratio_clip_min, 1.0 + self.ratio_clip_max)
        pg_loss = (torch.max(-advantages * ratios, -advantages * clipped) * token_mask).sum() / num_seqs

        if self.reference_policy_kl_penalty != 0:
            seq_log_ratio = ((curr_logprobs - ref_logprobs) * token_mask).sum(-1)
            # ok: KL003
            kl = _kl_penalty(seq_log_ratio)
            kl = kl.sum() / num_seqs
        else:
            kl = torch.zeros((), device=curr_logprobs.device)
        loss = pg_loss + self.reference_policy_kl_penalty * kl
        return loss, {"loss": loss.item(), "kl_penalty": kl.item(), "torch": str(_TORCH_VERSION)}


def make_loss_fn(cfg: dict[str, Any]) -> "LossFunction":
    return ClippedPGLossFn(cfg)
