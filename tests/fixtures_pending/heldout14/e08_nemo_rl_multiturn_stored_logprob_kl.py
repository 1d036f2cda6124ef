"""NeMo-RL style clipped policy-gradient loss for multi-turn agent rollouts.

``token_mask`` is 1 on the assistant's tokens of every turn and 0 on the
prompt and on tool / environment observations spliced between the turns.
The KL to the reference uses the Joschu (2020) k3 estimator.
"""

from typing import Any, TypedDict

import torch


class ClippedPGLossConfig(TypedDict):
    reference_policy_kl_penalty: float
    ratio_clip_min: float
    ratio_clip_max: float
    token_level_loss: bool


def masked_mean(values, mask, global_normalization_factor=None):
    normalization_factor = mask.sum() if global_normalization_factor is None else global_normalization_factor
    return (values * mask).sum() / normalization_factor.clamp(min=1)


def calculate_kl_penalty_joschu2020(logprobs_policy: torch.Tensor, logprobs_reference: torch.Tensor) -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimate of http://joschu.net/blog/kl-approx.html (k3)."""
    r = logprobs_reference - logprobs_policy
    return torch.exp(r) - r - 1


class ClippedPGLossFn:
    """PPO-clip / GRPO loss with an optional reference-policy KL penalty."""

    def __init__(self, cfg: ClippedPGLossConfig):
        self.reference_policy_kl_penalty = cfg["reference_policy_kl_penalty"]
        self.ratio_clip_min = cfg["ratio_clip_min"]
        self.ratio_clip_max = cfg["ratio_clip_max"]

    def __call__(self, next_token_logits: torch.Tensor, data: dict[str, Any], global_valid_toks: torch.Tensor):
        token_mask = data["token_mask"][:, 1:]
        sample_mask = data["sample_mask"]
        advantages = data["advantages"][:, 1:]
        prev_logprobs = data["prev_logprobs"][:, 1:]
        reference_policy_logprobs = data["reference_policy_logprobs"][:, 1:]

        mask = token_mask * sample_mask.unsqueeze(-1)

        next_token_logits = next_token_logits.to(torch.float32)
        next_token_logprobs = torch.nn.functional.log_softmax(next_token_logits, dim=-1)
        next_tokens = data["input_ids"][:, 1:].cuda() if next_token_logits.is_cuda else data["input_ids"][:, 1:]
        curr_logprobs = next_token_logprobs[:, :-1].gather(dim=-1, index=next_tokens.unsqueeze(-1)).squeeze(-1)

        # KL to the reference over the assistant tokens of all turns
        if self.reference_policy_kl_penalty != 0:
            # error: KL005
            kl = self.reference_policy_kl_penalty * calculate_kl_penalty_joschu2020(logprobs_policy=prev_logprobs, logprobs_reference=reference_policy_logprobs)
            kl = masked_mean(kl, mask, global_normalization_factor=global_valid_toks)
        else:
            kl = torch.tensor(0.0)

        ratios = (curr_logprobs - prev_logprobs).exp()
        ratios_clamped = ratios.clamp(1.0 - self.ratio_clip_min, 1.0 + self.ratio_clip_max)
        loss1 = -advantages * ratios
        loss2 = -advantages * ratios_clamped
        actor_loss = masked_mean(torch.max(loss1, loss2), mask, global_normalization_factor=global_valid_toks)

        loss = actor_loss + kl
        with torch.no_grad():
            probs_ratio = masked_mean(ratios.detach(), mask, global_normalization_factor=global_valid_toks).item()

        return loss, {
            "loss": loss.item(),
            "kl_penalty": kl.item() / self.reference_policy_kl_penalty if self.reference_policy_kl_penalty else 0,
            "probs_ratio": probs_ratio,
            "num_valid_samples": sample_mask.sum().item(),
        }
