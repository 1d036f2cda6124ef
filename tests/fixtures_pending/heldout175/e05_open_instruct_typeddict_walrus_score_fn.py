# Reviewer: open-instruct-style GRPO step on a packed TypedDict batch. The KL is
# enabled through walrus conditions (`(beta := args.beta) > 0`, `(ref := ...)`),
# and `match args.kl_estimator` picks the estimator; the default
# "score_function" weights each token's log-prob by its OWN detached log-ratio
# (`sg(logp_t - ref_t) * logp_t`), summed over tokens. That is right for one
# token given its prefix, but on sampled sequences it keeps only the s = t term
# of the reward-to-go: the token-level (partial) gradient of KL(pi||pi_ref).
# The "seq_k2" case (k2 of the sequence log-ratio) is correct, not the default.
# Verdict: bug, KL003, reported on the `kl_penalty = ...` line that multiplies the detached weight by the log-probs.
from dataclasses import dataclass
from typing import Literal, NotRequired, TypedDict

import torch
from torch import Tensor

from open_instruct.model_utils import log_softmax_and_gather


class PackedBatch(TypedDict):
    query_responses: Tensor
    attention_mask: Tensor
    response_mask: Tensor
    advantages: Tensor
    ref_logprobs: NotRequired[Tensor]
    old_logprobs: NotRequired[Tensor]


@dataclass(kw_only=True)
class Args:
    beta: float = 0.05
    clip_lower: float = 0.2
    clip_higher: float = 0.28
    kl_estimator: Literal["score_function", "seq_k2"] = "score_function"
    pack_length: int = 4096


def forward_logprobs(model, batch: PackedBatch, temperature: float = 1.0) -> Tensor:
    logits = model(input_ids=batch["query_responses"], attention_mask=batch["attention_mask"]).logits[:, :-1]
    return log_softmax_and_gather(logits / temperature, batch["query_responses"][:, 1:])


def grpo_loss(new_logprobs: Tensor, batch: PackedBatch, args: Args) -> tuple[Tensor, dict[str, float]]:
    mask = batch["response_mask"]
    old_logprobs = batch.get("old_logprobs", new_logprobs.detach())
    ratio = torch.exp(new_logprobs - old_logprobs)
    adv = batch["advantages"].unsqueeze(-1)
    pg_losses = torch.max(-adv * ratio, -adv * ratio.clamp(1 - args.clip_lower, 1 + args.clip_higher))
    loss = (pg_losses * mask).sum(-1).mean()
    stats: dict[str, float] = {"pg_loss": loss.item()}

    if (beta := args.beta) > 0 and (ref := batch.get("ref_logprobs")) is not None:
        match args.kl_estimator:
            case "score_function":
                log_ratio = (new_logprobs - ref).detach() * mask
                # error: KL003
                kl_penalty = (log_ratio * new_logprobs * mask).sum(-1).mean()
                stats["kl"] = log_ratio.sum(-1).mean().item()
            case "seq_k2":
                seq_log_ratio = ((new_logprobs - ref) * mask).sum(-1)
                kl_penalty = (0.5 * seq_log_ratio.square()).mean()
                stats["kl"] = seq_log_ratio.mean().item()
            case other:
                raise ValueError(f"{other=} is not a known estimator")
        loss = loss + beta * kl_penalty
    return loss, stats


def train_step(model, optimizer, batch: PackedBatch, args: Args) -> dict[str, float]:
    new_logprobs = forward_logprobs(model, batch)
    loss, stats = grpo_loss(new_logprobs, batch, args)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return stats
