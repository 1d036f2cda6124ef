# Reviewer: NeMo-RL-style loss. Policy and reference are wrapped in modules that
# return the same `LogprobOutput` dataclass (logprobs, entropy, kl). The
# reference module's forward is decorated @torch.no_grad() and, when given the
# policy's token log-probs, also fills `kl` with the k3 estimate against them.
# `ClippedPGLossFn` passes `cur.logprobs` (which has gradient) into the
# reference and adds `kl_coef * ref_out.kl` to the loss; but that k3 was
# computed inside the no_grad forward, so the KL term is a constant: gradient 0.
# Verdict: bug, KL005, reported where the loss calls the reference module (`ref_out = reference(...)`).
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from nemo_rl.algorithms.interfaces import LossFunction
from nemo_rl.distributed.batched_data_dict import BatchedDataDict


@dataclass
class LogprobOutput:
    logprobs: torch.Tensor
    entropy: torch.Tensor
    kl: Optional[torch.Tensor] = None


def _token_logprobs(model, data):
    resp_len = data["response_mask"].shape[1]
    logits = model(input_ids=data["input_ids"], attention_mask=data["attention_mask"]).logits[:, -resp_len - 1 : -1]
    logp = F.log_softmax(logits.float(), dim=-1)
    token_lp = logp.gather(-1, data["input_ids"][:, -resp_len:].unsqueeze(-1)).squeeze(-1)
    return token_lp, -(logp.exp() * logp).sum(-1)


class PolicyLogprobModule(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, data) -> LogprobOutput:
        lp, ent = _token_logprobs(self.model, data)
        return LogprobOutput(logprobs=lp, entropy=ent)


class ReferenceLogprobModule(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model.eval()

    @torch.no_grad()
    def forward(self, data, policy_logprobs=None) -> LogprobOutput:
        ref_lp, ent = _token_logprobs(self.model, data)
        kl = None
        if policy_logprobs is not None:
            log_ratio = policy_logprobs - ref_lp
            # ok: KL002
            kl = torch.exp(-log_ratio) + log_ratio - 1
        return LogprobOutput(logprobs=ref_lp, entropy=ent, kl=kl)


class ClippedPGLossFn(LossFunction):
    def __init__(self, cfg):
        self.ratio_clip = cfg.get("ratio_clip", 0.2)
        self.kl_coef = cfg.get("reference_policy_kl_penalty", 0.01)

    def __call__(self, policy, reference, data: BatchedDataDict):
        mask = data["response_mask"]
        cur = policy(data)
        # error: KL005
        ref_out = reference(data, policy_logprobs=cur.logprobs)
        ratio = torch.exp(cur.logprobs - data["prev_logprobs"])
        adv = data["advantages"].unsqueeze(-1)
        clipped = torch.clamp(ratio, 1 - self.ratio_clip, 1 + self.ratio_clip)
        pg = -torch.min(ratio * adv, clipped * adv)
        per_token = pg + self.kl_coef * ref_out.kl
        loss = (per_token * mask).sum(-1).mean()
        metrics = {"kl_penalty": (ref_out.kl * mask).sum(-1).mean().item(), "loss": loss.item()}
        return loss, metrics
