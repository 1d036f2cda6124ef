# Reviewer: NeMo-RL-style ClippedPG loss on full sequences (prompt + response +
# padding). The KL mask zeroes the prompt (positions < prompt_length) and, by
# mistake, keeps the right padding; that slip is harmless here because the
# log-probs of both models are multiplied by the attention mask first, so the
# padded log-ratios are 0 and carry no gradient. The KL itself is the
# importance-weighted k3, ratio * k3 with ratio = exp(curr - generation
# logprobs), summed over tokens: per token its gradient is x_t grad logp_t, so
# the sum is the token-level partial gradient of the response's KL(pi||pi_ref).
# Verdict: bug, KL003, reported on the line that multiplies k3 by the ratio.
from typing import Any

import torch

from nemo_rl.algorithms.interfaces import LossFunction
from nemo_rl.distributed.batched_data_dict import BatchedDataDict

DEFAULT_LOSS_CONFIG: dict[str, Any] = {
    "reference_policy_kl_penalty": 0.01,
    "ratio_clip_min": 0.2,
    "ratio_clip_max": 0.2,
    "use_importance_sampling_correction": True,
}


def masked_logprobs(logprobs, attention_mask):
    return logprobs * attention_mask


class PromptFreeKLClippedPGLoss(LossFunction):
    def __init__(self, cfg: dict = DEFAULT_LOSS_CONFIG):
        self.reference_policy_kl_penalty = cfg["reference_policy_kl_penalty"]
        self.ratio_clip_min = cfg["ratio_clip_min"]
        self.ratio_clip_max = cfg["ratio_clip_max"]
        self.use_is = cfg["use_importance_sampling_correction"]

    def kl_token_mask(self, attention_mask, prompt_lengths):
        positions = torch.arange(attention_mask.shape[1], device=attention_mask.device).unsqueeze(0)
        # everything from the first response token on (padding is not removed)
        return (positions >= prompt_lengths.unsqueeze(1)).to(attention_mask.dtype)

    def __call__(self, next_token_logprobs, data: BatchedDataDict):
        attention_mask = data["attention_mask"]
        token_mask = data["token_mask"]
        curr_logprobs = masked_logprobs(next_token_logprobs, attention_mask)
        prev_logprobs = masked_logprobs(data["prev_logprobs"], attention_mask)
        generation_logprobs = masked_logprobs(data["generation_logprobs"], attention_mask)
        reference_logprobs = masked_logprobs(data["reference_policy_logprobs"], attention_mask)
        advantages = data["advantages"]

        ratios = (curr_logprobs - prev_logprobs).exp()
        clipped = ratios.clamp(1 - self.ratio_clip_min, 1 + self.ratio_clip_max)
        pg_loss = (torch.max(-advantages * ratios, -advantages * clipped) * token_mask).sum(-1).mean()

        kl_mask = self.kl_token_mask(attention_mask, data["prompt_lengths"])
        log_ref_ratio = reference_logprobs - curr_logprobs
        # ok: KL002
        k3 = torch.exp(log_ref_ratio) - log_ref_ratio - 1
        kl_is_weights = torch.exp(curr_logprobs - generation_logprobs) if self.use_is else torch.ones_like(k3)
        # error: KL003
        kl = kl_is_weights * k3
        kl_loss = (kl * kl_mask).sum(-1).mean()

        loss = pg_loss + self.reference_policy_kl_penalty * kl_loss
        return loss, {"loss": loss.item(), "kl_penalty": kl_loss.item()}
