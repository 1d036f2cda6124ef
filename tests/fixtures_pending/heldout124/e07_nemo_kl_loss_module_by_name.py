# Reviewer: NeMo-RL-style loss wiring. KL loss modules are registered by name in
# KL_LOSSES and the one named by MasterConfig["loss_fn"]["kl_loss"] (default
# "k3_is") is instantiated in __init__. ImportanceWeightedK3Loss computes
# ratio * k3 per token with ratio = pi/pi_old (fresh on-policy samples: value 1,
# gradient grad logp) and sums it over the tokens of each response. Correct for
# one token; on sequences its expected gradient is only the token-level partial
# gradient of KL(pi||pi_ref) (no reward-to-go).
# Verdict: bug, KL003, on the line of the loss that calls the looked-up module.
from typing import Any

import torch
from torch import nn

from nemo_rl.algorithms.utils import masked_mean

MasterConfig = dict[str, Any]

DEFAULT_CONFIG: MasterConfig = {
    "loss_fn": {
        "reference_policy_kl_penalty": 0.01,
        "ratio_clip_min": 0.2,
        "ratio_clip_max": 0.2,
        "kl_loss": "k3_is",
        "max_seq_len": 1024,
    }
}


class SequenceK2Loss(nn.Module):
    def forward(self, logprobs, ref_logprobs, old_logprobs, mask):
        seq = ((logprobs - ref_logprobs) * mask).sum(-1)
        return (0.5 * seq**2).mean()


class ImportanceWeightedK3Loss(nn.Module):
    def forward(self, logprobs, ref_logprobs, old_logprobs, mask):
        ratio = torch.exp(logprobs - old_logprobs)
        d = ref_logprobs - logprobs
        k3 = torch.exp(d) - d - 1
        return ((ratio * k3) * mask).sum(-1).mean()


KL_LOSSES = {"seq_k2": SequenceK2Loss, "k3_is": ImportanceWeightedK3Loss}


class ClippedPGLossFn(nn.Module):
    def __init__(self, cfg: MasterConfig = DEFAULT_CONFIG):
        super().__init__()
        lc = cfg["loss_fn"]
        self.kl_coef = lc["reference_policy_kl_penalty"]
        self.clip_min, self.clip_max = lc["ratio_clip_min"], lc["ratio_clip_max"]
        self.max_seq_len = lc["max_seq_len"]
        self.kl_loss_fn = KL_LOSSES[lc["kl_loss"]]()

    def forward(self, curr_logprobs, prev_logprobs, reference_logprobs, advantages, token_mask):
        ratios = torch.exp(curr_logprobs - prev_logprobs)
        ratios_clamped = ratios.clamp(1.0 - self.clip_min, 1.0 + self.clip_max)
        adv = advantages.unsqueeze(-1)
        loss1 = -adv * ratios
        loss2 = -adv * ratios_clamped
        actor_loss = (torch.max(loss1, loss2) * token_mask).sum(-1).mean() / self.max_seq_len
        # error: KL003
        kl_loss = self.kl_loss_fn(curr_logprobs, reference_logprobs, prev_logprobs, token_mask)
        loss = actor_loss + self.kl_coef * kl_loss
        metrics = {
            "loss": loss.item(),
            "kl_penalty": kl_loss.item(),
            "probs_ratio": masked_mean(ratios.detach(), token_mask),
        }
        return loss, metrics


def train_microbatches(policy, optimizer, loss_fn: ClippedPGLossFn, microbatches):
    optimizer.zero_grad()
    all_metrics = []
    for mb in microbatches:
        logits = policy(mb["input_ids"]).logits[:, :-1]
        curr_logprobs = torch.gather(logits.log_softmax(-1), -1, mb["input_ids"][:, 1:, None]).squeeze(-1)
        loss, metrics = loss_fn(curr_logprobs, mb["prev_logprobs"], mb["reference_policy_logprobs"], mb["advantages"], mb["token_mask"])
        loss.backward()
        all_metrics.append(metrics)
    optimizer.step()
    return all_metrics
