"""A GRPO actor loss (ROLL / NeMo-RL flavour) whose KL term comes from a hand-written
`torch.autograd.Function` that "fuses" the low-variance KL and its backward.  The forward
is k3 = exp(ref - logp) - (ref - logp) - 1 and the backward returns its exact derivative
(1 - exp(ref - logp)) * grad, so the loss still differentiates k3: expected gradient of
KL(pi_ref||pi) token by token, not of KL(pi||pi_ref) (KL002, reported at the `.apply` call).
"""
from enum import Enum

import torch


class _FusedLowVarKL(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logp, ref_logp):
        delta = (ref_logp - logp).clamp(-20.0, 20.0)
        ctx.save_for_backward(delta)
        return delta.exp() - delta - 1.0

    @staticmethod
    def backward(ctx, grad_out):
        (delta,) = ctx.saved_tensors
        return grad_out * (1.0 - delta.exp()), None


class LossAgg(str, Enum):
    TOKEN_MEAN = "token_mean"
    SEQ_MEAN = "seq_mean"


class GRPOActorLoss(torch.nn.Module):
    def __init__(self, kl_loss_coef: float = 0.001, clip_ratio: float = 0.2, agg: LossAgg = LossAgg.SEQ_MEAN):
        super().__init__()
        self.kl_loss_coef = kl_loss_coef
        self.clip_ratio = clip_ratio
        self.agg = agg

    def _agg(self, x, mask):
        if self.agg is LossAgg.TOKEN_MEAN:
            return (x * mask).sum() / mask.sum()
        return ((x * mask).sum(-1)).mean()

    def forward(self, log_probs, old_log_probs, ref_log_probs, advantages, response_mask):
        ratio = torch.exp(log_probs - old_log_probs)
        pg = -torch.min(ratio * advantages[:, None], ratio.clamp(1 - self.clip_ratio, 1 + self.clip_ratio) * advantages[:, None])
        pg_loss = self._agg(pg, response_mask)
        # error: KL002
        kl = _FusedLowVarKL.apply(log_probs, ref_log_probs)
        kl_loss = self._agg(kl, response_mask)
        return pg_loss + self.kl_loss_coef * kl_loss, {"actor/kl_loss": kl_loss.detach()}


def train_microbatch(policy, ref_policy, batch, loss_fn: GRPOActorLoss, optimizer):
    def logps(model):
        logits = model(batch["input_ids"]).logits
        return torch.gather(logits.log_softmax(-1), -1, batch["input_ids"].unsqueeze(-1)).squeeze(-1)

    log_probs = logps(policy)
    with torch.no_grad():
        ref_log_probs = logps(ref_policy)
    loss, metrics = loss_fn(log_probs, batch["old_log_probs"], ref_log_probs, batch["advantages"], batch["response_mask"])
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return metrics
