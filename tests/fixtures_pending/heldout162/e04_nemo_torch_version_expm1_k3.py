# Reviewer: NeMo-RL-style ClippedPG loss. The per-token KL penalty is a
# module-level function defined twice under a torch version check: on
# torch >= 2.1 (any current install) it is written with torch.expm1 as
# expm1(-x) + x with x = logp - ref, which is k3; the legacy branch (torch < 2.1)
# is never taken. The loss adds the per-token k3, with its gradient, summed over
# tokens and divided by the number of sequences: the token-level gradient of
# KL(pi_ref||pi). Types come from `if TYPE_CHECKING:` imports only.
# Verdict: bug, KL002, reported where the loss calls _kl_penalty.
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
        # expm1 keeps precision for |x| << 1 under bf16 autocast
        return torch.expm1(-log_ratio) + log_ratio

else:

    def _kl_penalty(log_ratio: torch.Tensor) -> torch.Tensor:
        return 0.5 * log_ratio.pow(2)


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
            # error: KL002
            kl = _kl_penalty(curr_logprobs - ref_logprobs)
            kl = (kl * token_mask).sum() / num_seqs
        else:
            kl = torch.zeros((), device=curr_logprobs.device)
        loss = pg_loss + self.reference_policy_kl_penalty * kl
        return loss, {"loss": loss.item(), "kl_penalty": kl.item(), "torch": str(_TORCH_VERSION)}


def make_loss_fn(cfg: dict[str, Any]) -> "LossFunction":
    return ClippedPGLossFn(cfg)
