"""GRPO/PPO clipped policy-gradient loss over a padded batch of token sequences."""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

import torch

from .kl import KLType, calculate_kl, masked_mean


class ClippedPGLossConfig(TypedDict):
    ratio_clip_min: float
    ratio_clip_max: float
    reference_policy_kl_penalty: float
    reference_policy_kl_type: NotRequired[str]
    kl_input_clamp_value: NotRequired[float | None]
    token_level_loss: bool


DEFAULT_LOSS_CONFIG = ClippedPGLossConfig(
    ratio_clip_min=0.2,
    ratio_clip_max=0.2,
    reference_policy_kl_penalty=0.01,
    reference_policy_kl_type="k3",
    kl_input_clamp_value=20.0,
    token_level_loss=True,
)


class ClippedPGLossFn:
    def __init__(self, cfg: ClippedPGLossConfig = DEFAULT_LOSS_CONFIG):
        self.ratio_clip_min = cfg["ratio_clip_min"]
        self.ratio_clip_max = cfg["ratio_clip_max"]
        self.reference_policy_kl_penalty = cfg["reference_policy_kl_penalty"]
        self.kl_type = KLType(cfg.get("reference_policy_kl_type", KLType.K3))
        self.kl_input_clamp_value = cfg.get("kl_input_clamp_value", 20.0)
        self.token_level_loss = cfg["token_level_loss"]

    def __call__(
        self,
        next_token_logits: torch.Tensor,
        data: dict[str, torch.Tensor],
        global_valid_seqs: torch.Tensor,
        global_valid_toks: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        token_mask = data["token_mask"][:, 1:]
        sample_mask = data["sample_mask"]
        mask = token_mask * sample_mask.unsqueeze(-1)
        advantages = data["advantages"][:, 1:]
        prev_logprobs = data["prev_logprobs"][:, 1:]
        ref_lp = data["reference_policy_logprobs"][:, 1:]

        next_token_logprobs = torch.nn.functional.log_softmax(next_token_logits.to(torch.float32), dim=-1)
        next_tokens = data["input_ids"][:, 1:]
        curr_logprobs = next_token_logprobs[:, :-1].gather(-1, next_tokens.unsqueeze(-1)).squeeze(-1)

        if self.reference_policy_kl_penalty != 0:
            # error: KL002
            kl = self.reference_policy_kl_penalty * calculate_kl(curr_logprobs, ref_lp, kl_type=self.kl_type, input_clamp_value=self.kl_input_clamp_value)
            if self.token_level_loss:
                kl = masked_mean(kl, mask, global_normalization_factor=global_valid_toks)
            else:
                per_seq = masked_mean(kl, token_mask, dim=-1)
                kl = masked_mean(per_seq, sample_mask, global_normalization_factor=global_valid_seqs)
        else:
            kl = torch.tensor(0.0, device=next_token_logits.device)

        ratios = (curr_logprobs - prev_logprobs).exp()
        ratios_clamped = ratios.clamp(1.0 - self.ratio_clip_min, 1.0 + self.ratio_clip_max)
        loss1 = -advantages * ratios
        loss2 = -advantages * ratios_clamped
        if self.token_level_loss:
            actor_loss = masked_mean(torch.max(loss1, loss2), mask, global_normalization_factor=global_valid_toks)
        else:
            per_seq = masked_mean(torch.max(loss1, loss2), token_mask, dim=-1)
            actor_loss = masked_mean(per_seq, sample_mask, global_normalization_factor=global_valid_seqs)

        loss = actor_loss + kl
        with torch.no_grad():
            probs_ratio = masked_mean(ratios.detach(), mask, global_normalization_factor=global_valid_toks)
        return loss, {
            "loss": loss.item(),
            "kl_penalty": kl.item() / self.reference_policy_kl_penalty if self.reference_policy_kl_penalty else 0.0,
            "probs_ratio": probs_ratio.item(),
            "num_valid_samples": sample_mask.sum().item(),
        }
