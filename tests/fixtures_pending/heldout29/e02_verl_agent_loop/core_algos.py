"""Advantage estimators registered by name, KL helpers and controllers."""
import torch

ADV_ESTIMATOR_REGISTRY = {}


def register_adv_est(name):
    def decorator(fn):
        ADV_ESTIMATOR_REGISTRY[name] = fn
        return fn

    return decorator


def get_adv_estimator_fn(name):
    if name not in ADV_ESTIMATOR_REGISTRY:
        raise ValueError(f"Unknown advantage estimator: {name}")
    return ADV_ESTIMATOR_REGISTRY[name]


def masked_mean(values, mask, axis=None):
    if axis is None:
        return (values * mask).sum() / mask.sum().clamp(min=1.0)
    return (values * mask).sum(axis) / mask.sum(axis).clamp(min=1.0)


class FixedKLController:
    def __init__(self, kl_coef):
        self.value = kl_coef

    def update(self, current_kl, n_steps):
        pass


def kl_penalty(logprob, ref_logprob, kl_penalty):
    """Per-token KL estimate; used by the reward path and by the KL loss."""
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty == "abs":
        return (logprob - ref_logprob).abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        kl = ref_logprob - logprob
        ratio = torch.exp(kl)
        return ratio - kl - 1
    raise NotImplementedError(kl_penalty)


@register_adv_est("gae")
def compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma=1.0, lam=1.0):
    """GAE; positions with response_mask == 0 (tool output) are skipped."""
    with torch.no_grad():
        nextvalues = torch.zeros_like(token_level_rewards[:, 0])
        lastgaelam = torch.zeros_like(token_level_rewards[:, 0])
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


@register_adv_est("grpo")
def compute_grpo_outcome_advantage(token_level_rewards, response_mask, index, epsilon=1e-6, **kwargs):
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        groups = {}
        for i, uid in enumerate(index):
            groups.setdefault(uid, []).append(i)
        out = torch.zeros_like(scores)
        for members in groups.values():
            s = scores[members]
            out[members] = (s - s.mean()) / (s.std(unbiased=False) + epsilon)
        advantages = out.unsqueeze(-1) * response_mask
    return advantages, advantages


def compute_policy_loss(old_log_prob, log_prob, advantages, response_mask, cliprange=0.2, loss_agg_mode="seq-mean-token-sum"):
    negative_approx_kl = log_prob - old_log_prob
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)
    pg_losses = torch.maximum(pg_losses1, pg_losses2)
    return agg_loss(pg_losses, response_mask, loss_agg_mode)


def agg_loss(loss_mat, loss_mask, loss_agg_mode):
    if loss_agg_mode == "token-mean":
        return masked_mean(loss_mat, loss_mask)
    if loss_agg_mode == "seq-mean-token-sum":
        return (loss_mat * loss_mask).sum(dim=-1).mean()
    raise ValueError(loss_agg_mode)
