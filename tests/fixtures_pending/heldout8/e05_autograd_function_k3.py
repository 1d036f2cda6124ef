"""KL penalty implemented as a custom ``torch.autograd.Function`` (bug: KL002).

The Function returns the k3 value exp(ref - logp) - (ref - logp) - 1 and its
hand-written backward is the exact derivative of that value,
(1 - exp(ref - logp)) * grad_out. The loss is therefore k3 differentiated as a
loss: its expected gradient is the (token-level) gradient of KL(pi_ref||pi),
the wrong divergence, not grad KL(pi||pi_ref). Fusing it into a Function saves
memory but does not change the maths.
"""

import torch


class _FusedLowVarKL(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
        neg_log_ratio = (ref_logp - logp).clamp(-20.0, 20.0)
        ratio = neg_log_ratio.exp()
        ctx.save_for_backward(ratio)
        return ratio - neg_log_ratio - 1.0

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (ratio,) = ctx.saved_tensors
        # d/d logp [exp(ref - logp) - (ref - logp) - 1] = 1 - exp(ref - logp)
        return grad_out * (1.0 - ratio), None


def fused_low_var_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return _FusedLowVarKL.apply(logp, ref_logp)


class GRPOObjective:
    def __init__(self, beta: float = 0.04, eps: float = 0.2, max_completion_length: int = 1024):
        self.beta = beta
        self.eps = eps
        self.max_completion_length = max_completion_length

    def __call__(self, logp, old_logp, ref_logp, advantages, completion_mask):
        coef_1 = torch.exp(logp - old_logp)
        coef_2 = coef_1.clamp(1 - self.eps, 1 + self.eps)
        per_token_loss = -torch.min(coef_1 * advantages[:, None], coef_2 * advantages[:, None])
        # error: KL002
        per_token_kl = _FusedLowVarKL.apply(logp, ref_logp)
        per_token_loss = per_token_loss + self.beta * per_token_kl
        # Dr. GRPO normalisation: a constant denominator
        return (per_token_loss * completion_mask).sum() / (logp.shape[0] * self.max_completion_length)


def step(model, optimizer, batch, objective: GRPOObjective):
    logp = model.completion_logprobs(batch["prompt_ids"], batch["completion_ids"])
    loss = objective(logp, batch["old_logp"], batch["ref_logp"], batch["advantages"], batch["completion_mask"])
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad()
    return loss.item()
