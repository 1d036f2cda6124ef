# Reviewer: a NeMo-RL-style clipped PG loss with a sequence-level k2 penalty
# (the right estimator). To log it, the author wrote `kl.detach_()` (in place)
# instead of `kl.detach()`, BEFORE the penalty joins the loss: detach_()
# cuts `kl` itself out of the graph, so `reference_policy_kl_penalty * kl` is a
# constant and the KL term has zero gradient. The loss still prints it.
# Verdict: bug, KL005, reported on the line that computes the estimate.
from typing import Any, TypedDict

import torch
from nemo_rl.algorithms.interfaces import LossFunction


class ClippedPGLossConfig(TypedDict):
    reference_policy_kl_penalty: float
    ratio_clip_min: float
    ratio_clip_max: float


DEFAULT_LOSS_CONFIG: ClippedPGLossConfig = {
    "reference_policy_kl_penalty": 0.01,
    "ratio_clip_min": 0.2,
    "ratio_clip_max": 0.2,
}


class ClippedPGSeqKLLossFn(LossFunction):
    def __init__(self, cfg: ClippedPGLossConfig = DEFAULT_LOSS_CONFIG):
        self.reference_policy_kl_penalty = cfg["reference_policy_kl_penalty"]
        self.ratio_clip_min = cfg["ratio_clip_min"]
        self.ratio_clip_max = cfg["ratio_clip_max"]

    def __call__(self, next_token_logits: torch.Tensor, data: dict[str, Any]):
        token_mask = data["token_mask"]
        response_length = token_mask.size(1)
        next_tokens = data["input_ids"][:, -response_length:]
        logits = next_token_logits[:, -response_length - 1 : -1]
        curr_logprobs = logits.log_softmax(-1).gather(-1, next_tokens.unsqueeze(-1)).squeeze(-1)
        prev_logprobs = data.get("prev_logprobs", curr_logprobs.detach())
        reference_logprobs = data["reference_policy_logprobs"]
        advantages = data["advantages"].unsqueeze(-1)

        ratios = (curr_logprobs - prev_logprobs).exp()
        ratios_clamped = ratios.clamp(1.0 - self.ratio_clip_min, 1.0 + self.ratio_clip_max)
        clip_loss = torch.max(-advantages * ratios, -advantages * ratios_clamped)
        actor_loss = (clip_loss * token_mask).sum(-1).mean()

        metrics = {"actor_loss": actor_loss.item()}
        # error: KL005
        kl = 0.5 * ((curr_logprobs - reference_logprobs) * token_mask).sum(-1).square().mean()
        metrics["kl_penalty"] = kl.detach_().item()
        loss = actor_loss + self.reference_policy_kl_penalty * kl
        metrics["loss"] = loss.item()
        return loss, metrics


def train_microbatch(policy_model, reference_model, optimizer, loss_fn: LossFunction, data: dict):
    with torch.no_grad():
        ref_logits = reference_model(input_ids=data["input_ids"], attention_mask=data["attention_mask"]).logits
        n = data["token_mask"].size(1)
        ref_tokens = data["input_ids"][:, -n:].unsqueeze(-1)
        data["reference_policy_logprobs"] = ref_logits[:, -n - 1 : -1].log_softmax(-1).gather(-1, ref_tokens).squeeze(-1)
    logits = policy_model(input_ids=data["input_ids"], attention_mask=data["attention_mask"]).logits
    loss, metrics = loss_fn(logits, data)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return metrics
