# Reviewer: NeMo-RL-style loss wiring as in e07 (KL loss modules registered by
# name, instantiated in __init__). The default, "k3_to_go", logs the k3 value
# but differentiates the reward-to-go surrogate:
# sg(k3_t) + G_t * (logp_t - sg(logp_t)), G_t = sum_{s>=t} sg(logr_s) (masked
# reverse cumsum). Its expected gradient is grad KL(pi||pi_ref) of the
# sequence. The plain per-token k3 module is registered but not selected.
# Verdict: correct. Neither the k3 line inside the module nor the call is reported.
from typing import Any

import torch
from torch import nn

from nemo_rl.algorithms.utils import masked_mean

DEFAULT_CONFIG: dict[str, Any] = {
    "loss_fn": {"reference_policy_kl_penalty": 0.01, "ratio_clip": 0.2, "kl_loss": "k3_to_go"},
}


class TokenK3Loss(nn.Module):
    def forward(self, logprobs, ref_logprobs, mask):
        d = ref_logprobs - logprobs
        return (((torch.exp(d) - d - 1)) * mask).sum(-1).mean()


class K3ValueKLToGoLoss(nn.Module):
    """Logs k3, differentiates the sequence KL (reward-to-go of the log-ratio)."""

    def forward(self, logprobs, ref_logprobs, mask):
        log_ratio = ((logprobs - ref_logprobs) * mask).detach()
        # ok: KL002
        k3 = (torch.exp(-log_ratio) + log_ratio - 1) * mask
        kl_to_go = log_ratio.flip(-1).cumsum(-1).flip(-1)
        surrogate = k3 + kl_to_go * (logprobs - logprobs.detach()) * mask
        return surrogate.sum(-1).mean()


KL_LOSSES = {"k3": TokenK3Loss, "k3_to_go": K3ValueKLToGoLoss}


class ClippedPGLossFn(nn.Module):
    def __init__(self, cfg=DEFAULT_CONFIG):
        super().__init__()
        lc = cfg["loss_fn"]
        self.kl_coef = lc["reference_policy_kl_penalty"]
        self.ratio_clip = lc["ratio_clip"]
        self.kl_loss_fn = KL_LOSSES[lc["kl_loss"]]()

    def forward(self, curr_logprobs, prev_logprobs, reference_logprobs, advantages, token_mask):
        ratios = torch.exp(curr_logprobs - prev_logprobs)
        adv = advantages.unsqueeze(-1)
        loss1 = -adv * ratios
        loss2 = -adv * ratios.clamp(1.0 - self.ratio_clip, 1.0 + self.ratio_clip)
        actor_loss = (torch.max(loss1, loss2) * token_mask).sum(-1).mean()
        # ok: KL003
        kl_loss = self.kl_loss_fn(curr_logprobs, reference_logprobs, token_mask)
        loss = actor_loss + self.kl_coef * kl_loss
        return loss, {"loss": loss.item(), "kl_penalty": kl_loss.item(), "probs_ratio": masked_mean(ratios.detach(), token_mask)}


def train_microbatches(policy, optimizer, loss_fn: ClippedPGLossFn, microbatches):
    optimizer.zero_grad()
    for mb in microbatches:
        logits = policy(mb["input_ids"]).logits[:, :-1]
        curr = torch.gather(logits.log_softmax(-1), -1, mb["input_ids"][:, 1:, None]).squeeze(-1)
        loss, metrics = loss_fn(curr, mb["prev_logprobs"], mb["reference_policy_logprobs"], mb["advantages"], mb["token_mask"])
        loss.backward()
    optimizer.step()
    return metrics
