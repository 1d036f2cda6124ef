"""Core algorithm helpers for a verl-style PPO/GRPO actor (KL penalties, loss aggregation, GAE).

Nothing in this module is a loss on its own: the estimators below are judged where an
actor calls them (``verl_actor.py``), with the estimator its configuration selects.
A finding inside these helpers would be a duplicate of the call site's.

Fixture: parsed by the tests, never executed.
"""

from __future__ import annotations

import torch


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    return (values * mask).sum(axis) if axis is not None else (values * mask).sum()


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    return masked_sum(values, mask, axis) / (mask.sum(axis) if axis is not None else mask.sum()).clamp(min=1)


def kl_penalty_forward(logprob: torch.FloatTensor, ref_logprob: torch.FloatTensor, kl_penalty: str) -> torch.FloatTensor:
    """Per-token value of the KL estimate between the actor and the reference policy."""
    if kl_penalty in ("kl", "k1"):
        # ok: KL001, KL002, KL003
        return logprob - ref_logprob
    if kl_penalty == "abs":
        return (logprob - ref_logprob).abs()
    if kl_penalty in ("mse", "k2"):
        # ok: KL001, KL002, KL003
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        kl = ref_logprob - logprob
        # Clamp before exp: a single outlier token would otherwise overflow in bf16.
        kl = torch.clamp(kl, min=-20, max=20)
        ratio = torch.exp(kl)
        # ok: KL001, KL002, KL003
        kld = (ratio - kl - 1).contiguous()
        return torch.clamp(kld, min=-10, max=10)
    if kl_penalty == "full":
        raise NotImplementedError("full-vocabulary KL needs the logits, not the sampled log-probs")
    raise NotImplementedError(f"unknown kl_penalty {kl_penalty!r}")


def kl_penalty(logprob: torch.FloatTensor, ref_logprob: torch.FloatTensor, kl_penalty: str = "low_var_kl") -> torch.FloatTensor:
    """KL estimate with an optional straight-through gradient.

    A trailing ``+`` (``"low_var_kl+"``, ``"k3+"``) keeps the value of the named estimator
    and takes the gradient of k2 instead (``logr * grad logp`` per token).
    """
    forward_score = kl_penalty_forward(logprob, ref_logprob, kl_penalty.rstrip("+"))
    if not kl_penalty.endswith("+"):
        return forward_score
    # ok: KL001, KL002, KL003
    backward_score = 0.5 * (logprob - ref_logprob).square()
    return backward_score - backward_score.detach() + forward_score.detach()


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    dp_size: int = 1,
    batch_num_tokens: int | None = None,
    global_batch_size: int | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Aggregate a [bs, response_length] matrix to a scalar, normalised over the global batch."""
    if loss_agg_mode == "token-mean":
        if batch_num_tokens is None:
            batch_num_tokens = loss_mask.sum()
        return masked_sum(loss_mat, loss_mask) / batch_num_tokens * dp_size
    if loss_agg_mode == "seq-mean-token-sum":
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)
        if global_batch_size is None:
            global_batch_size = seq_losses.shape[0]
        return seq_losses.sum() / global_batch_size * dp_size
    if loss_agg_mode == "seq-mean-token-mean":
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / loss_mask.sum(dim=-1).clamp(min=1)
        if global_batch_size is None:
            global_batch_size = seq_losses.shape[0]
        return seq_losses.sum() / global_batch_size * dp_size
    if loss_agg_mode == "seq-mean-token-sum-norm":
        scale = loss_scale_factor if loss_scale_factor is not None else loss_mask.shape[-1]
        return torch.sum(loss_mat * loss_mask) / (loss_mask.shape[0] * scale)
    raise ValueError(f"invalid loss_agg_mode: {loss_agg_mode}")


def compute_policy_loss(old_log_prob, log_prob, advantages, response_mask, cliprange=0.2, loss_agg_mode="token-mean", **agg_kwargs):
    negative_approx_kl = log_prob - old_log_prob
    ratio = torch.exp(negative_approx_kl)
    # ok: KL001, KL002, KL003
    ppo_kl = masked_mean(-negative_approx_kl, response_mask)
    pg_losses = torch.maximum(-advantages * ratio, -advantages * torch.clamp(ratio, 1 - cliprange, 1 + cliprange))
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, **agg_kwargs)
    return pg_loss, ppo_kl.detach()


@torch.no_grad()
def compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma: float = 1.0, lam: float = 1.0):
    nextvalues = 0
    lastgaelam = 0
    advantages_reversed = []
    gen_len = token_level_rewards.shape[-1]
    for t in reversed(range(gen_len)):
        delta = token_level_rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam_ = delta + gamma * lam * lastgaelam
        nextvalues = values[:, t] * response_mask[:, t] + (1 - response_mask[:, t]) * nextvalues
        lastgaelam = lastgaelam_ * response_mask[:, t] + (1 - response_mask[:, t]) * lastgaelam
        advantages_reversed.append(lastgaelam)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)
    returns = advantages + values
    return advantages, returns
