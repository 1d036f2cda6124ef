# Reviewer: NeMo-RL-style loss object that holds a list of sub-losses. The
# trainer builds `CompositeLoss` from `loss_fn.components` in the config; each
# component is a LossFunction-like object returning (loss, metrics). The
# reference-KL component squares the per-token log-ratio (k2) and sums it over
# the tokens of each response.
# Verdict: bug (KL003). Per-token k2 summed over tokens has gradient
# sum_t logr_t * grad logp_t: the token-level partial gradient of the sequence
# KL(pi||pi_ref); later tokens' log-ratios never weight an earlier token.
from typing import Any, Dict, List, Tuple

import torch

from nemo_rl.algorithms.interfaces import LossFunction, LossType  # noqa: F401
from nemo_rl.distributed.batched_data_dict import BatchedDataDict  # noqa: F401


class ClippedPGComponent:
    name = "pg"

    def __init__(self, ratio_clip: float = 0.2):
        self.ratio_clip = ratio_clip

    def __call__(self, curr_logprobs, data) -> Tuple[torch.Tensor, Dict[str, Any]]:
        mask = data["token_mask"]
        ratio = torch.exp(curr_logprobs - data["prev_logprobs"])
        adv = data["advantages"]
        clipped = ratio.clamp(1 - self.ratio_clip, 1 + self.ratio_clip)
        loss = torch.max(-adv * ratio, -adv * clipped)
        return (loss * mask).sum(-1).mean(), {"pg_loss": loss.detach().mean().item()}


class ReferenceKLComponent:
    name = "ref_kl"

    def __init__(self, coef: float):
        self.coef = coef

    def __call__(self, curr_logprobs, data) -> Tuple[torch.Tensor, Dict[str, Any]]:
        mask = data["token_mask"]
        # error: KL003
        per_token_kl = 0.5 * (curr_logprobs - data["reference_policy_logprobs"]) ** 2
        kl = (per_token_kl * mask).sum(-1).mean()
        return self.coef * kl, {"kl_penalty": kl.detach().item()}


class CompositeLoss:
    """Sums the sub-losses listed under `loss_fn.components`."""

    loss_type = "sequence_level"

    def __init__(self, components: List[Any]):
        self.components = components

    def __call__(self, curr_logprobs, data):
        total = torch.zeros((), dtype=curr_logprobs.dtype)
        metrics: Dict[str, Any] = {}
        for comp in self.components:
            loss, m = comp(curr_logprobs, data)
            total = total + loss
            metrics.update({f"{comp.name}/{k}": v for k, v in m.items()})
        metrics["loss"] = total.detach().item()
        return total, metrics


def build_loss_fn(cfg: Dict[str, Any]) -> CompositeLoss:
    factories = {
        "pg": lambda c: ClippedPGComponent(ratio_clip=c.get("ratio_clip", 0.2)),
        "ref_kl": lambda c: ReferenceKLComponent(coef=c["coef"]),
    }
    return CompositeLoss([factories[c["type"]](c) for c in cfg["components"]])


DEFAULT_LOSS_CFG = {
    "components": [
        {"type": "pg", "ratio_clip": 0.2},
        {"type": "ref_kl", "coef": 0.01},
    ]
}


def train_step(policy, batch, loss_fn: CompositeLoss, optimizer, gbs_chunks: int = 2):
    optimizer.zero_grad()
    metrics = []
    for mb in batch.split(gbs_chunks):
        logits = policy(mb["input_ids"]).logits[:, :-1]
        curr_logprobs = torch.gather(logits.log_softmax(-1), -1, mb["input_ids"][:, 1:].unsqueeze(-1)).squeeze(-1)
        loss, m = loss_fn(curr_logprobs, mb)
        (loss / gbs_chunks).backward()
        metrics.append(m)
    optimizer.step()
    return metrics
