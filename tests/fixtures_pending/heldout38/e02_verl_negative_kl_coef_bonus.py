# Reviewer: the algorithm config stores kl_coef as a *negative* bonus (our reward-shaping
# convention: every shaping term is `scores + coef * term`), but apply_kl_penalty still
# uses verl's `scores - kl_coef * kld`. The two minus signs cancel: the KL reward is added
# to the token rewards, and the actor is paid for moving away from the reference.
from dataclasses import dataclass, field

import torch
from verl import DataProto


@dataclass
class ShapingConfig:
    # convention: shaping coefficients are bonuses; a penalty is a negative bonus
    kl_coef: float = -0.001
    kl_penalty: str = "kl"
    gamma: float = 1.0
    lam: float = 1.0
    extra: dict = field(default_factory=dict)


def kl_penalty(logprob: torch.FloatTensor, ref_logprob: torch.FloatTensor, kl_penalty: str = "kl") -> torch.FloatTensor:
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty == "abs":
        return (logprob - ref_logprob).abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        kl = ref_logprob - logprob
        return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)
    raise NotImplementedError(kl_penalty)


def apply_kl_penalty(data: DataProto, cfg: ShapingConfig):
    response_mask = data.batch["response_mask"]
    token_level_scores = data.batch["token_level_scores"]
    with torch.no_grad():
        # error: KL006
        kld = kl_penalty(data.batch["old_log_probs"], data.batch["ref_log_prob"], kl_penalty=cfg.kl_penalty)
        kld = kld * response_mask
        token_level_rewards = token_level_scores - cfg.kl_coef * kld
    data.batch["token_level_rewards"] = token_level_rewards
    current_kl = (kld.sum(-1) / response_mask.sum(-1).clamp(min=1)).mean().item()
    return data, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": cfg.kl_coef}


@torch.no_grad()
def compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma, lam):
    # whitening is switched off in this recipe (norm_adv_by_std_in_grpo=False, no masked_whiten)
    lastgaelam = 0
    advantages_reversed = []
    gen_len = token_level_rewards.shape[-1]
    for t in reversed(range(gen_len)):
        nextvalues = values[:, t + 1] if t < gen_len - 1 else 0.0
        delta = token_level_rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam = delta + gamma * lam * lastgaelam
        advantages_reversed.append(lastgaelam)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)
    return advantages * response_mask, (advantages + values) * response_mask


def compute_policy_loss(old_log_prob, log_prob, advantages, response_mask, clip_ratio=0.2):
    negative_approx_kl = log_prob - old_log_prob
    ratio = torch.exp(negative_approx_kl)
    pg_losses = torch.maximum(-advantages * ratio, -advantages * torch.clamp(ratio, 1 - clip_ratio, 1 + clip_ratio))
    # seq-mean-token-sum
    return (pg_losses * response_mask).sum(-1).mean()


def update_actor(actor, optimizer, data: DataProto, cfg: ShapingConfig):
    data, metrics = apply_kl_penalty(data, cfg)
    values = torch.zeros_like(data.batch["token_level_rewards"])  # critic-free baseline
    advantages, _ = compute_gae_advantage_return(
        data.batch["token_level_rewards"], values, data.batch["response_mask"], cfg.gamma, cfg.lam
    )
    log_prob = actor.compute_log_prob(data)
    loss = compute_policy_loss(data.batch["old_log_probs"], log_prob, advantages, data.batch["response_mask"])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    metrics["actor/pg_loss"] = loss.item()
    return metrics
