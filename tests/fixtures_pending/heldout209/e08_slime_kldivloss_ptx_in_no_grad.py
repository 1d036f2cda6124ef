# Reviewer: slime-style GRPO loss with an auxiliary "stay close to the SFT
# reference on SFT data" term: an nn.KLDivLoss(reduction="batchmean",
# log_target=True) module with the policy as input and the reference as target,
# i.e. the exact KL(pi_ref||pi) per teacher-forced SFT position (a legitimate,
# exact divergence on data prefixes). But the call sits inside the
# `with torch.no_grad()` block that runs the reference model, so ptx_kl is a
# constant for autograd: it is added to the loss and logged, and its gradient
# is exactly zero. The regulariser does nothing.
# Verdict: bug, KL005, reported on the self.ptx_kl(...) line (the estimate).
import torch
import torch.nn as nn
import torch.nn.functional as F

from slime.backends.megatron_utils.loss import get_log_probs_and_entropy
from slime.utils.types import RolloutBatch


class GRPOWithPtxKL(nn.Module):
    def __init__(self, eps_clip: float = 0.2, ptx_kl_coef: float = 0.1):
        super().__init__()
        self.eps_clip = eps_clip
        self.ptx_kl_coef = ptx_kl_coef
        self.ptx_kl = nn.KLDivLoss(reduction="batchmean", log_target=True)

    def pg_loss(self, log_probs, old_log_probs, advantages, loss_mask):
        ratio = torch.exp(log_probs - old_log_probs)
        clipped = ratio.clamp(1 - self.eps_clip, 1 + self.eps_clip)
        loss = -torch.min(ratio * advantages, clipped * advantages)
        return (loss * loss_mask).sum(-1).mean()

    def forward(self, log_probs, old_log_probs, advantages, loss_mask, sft_logits, sft_ref_logits, sft_mask):
        pg_loss = self.pg_loss(log_probs, old_log_probs, advantages, loss_mask)
        sft_logp = F.log_softmax(sft_logits.float(), dim=-1)
        valid = sft_mask.bool()
        with torch.no_grad():
            sft_ref_logp = F.log_softmax(sft_ref_logits.float(), dim=-1)
            # error: KL005
            ptx_kl = self.ptx_kl(sft_logp[valid], sft_ref_logp[valid])
        loss = pg_loss + self.ptx_kl_coef * ptx_kl
        return loss, {"pg_loss": pg_loss.detach(), "ptx_kl": ptx_kl}


def train_step(model, ref_model, loss_fn: GRPOWithPtxKL, rollout: RolloutBatch, sft_batch, optimizer):
    n = rollout["loss_mask"].size(1)
    logits = model(rollout["tokens"]).logits[:, -n - 1 : -1]
    log_probs = torch.gather(logits.float().log_softmax(-1), -1, rollout["tokens"][:, -n:].unsqueeze(-1)).squeeze(-1)
    m = sft_batch["loss_mask"].size(1)
    sft_logits = model(sft_batch["tokens"]).logits[:, -m - 1 : -1]
    with torch.no_grad():
        sft_ref_logits = ref_model(sft_batch["tokens"]).logits[:, -m - 1 : -1]
    loss, metrics = loss_fn(
        log_probs,
        rollout["log_probs"],
        rollout["advantages"],
        rollout["loss_mask"],
        sft_logits,
        sft_ref_logits,
        sft_batch["loss_mask"],
    )
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return {k: v.item() for k, v in metrics.items()}
