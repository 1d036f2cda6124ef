# Reviewer: a single-file fork of verl's ray_trainer + core_algos with the KL in
# the reward (use_kl_in_reward). apply_kl_penalty computes the k1 estimate with
# kl_penalty(..., "kl"), the right estimate for a reward, and GAE with
# gamma = lam = 1 credits it by returns. But the penalty is *added* to the scores
# (token_level_scores + beta * kld): the policy gradient then climbs the KL, an
# expected gradient of -grad KL(pi||pi_ref) in the minimised loss (KL006).
# Reported inside apply_kl_penalty, on the line that calls kl_penalty.
from dataclasses import dataclass

import torch

from verl import DataProto
from verl.trainer.ppo.core_algos import AdaptiveKLController
from verl.utils.torch_functional import masked_mean


@dataclass
class AlgorithmConfig:
    gamma: float = 1.0
    lam: float = 1.0
    use_kl_in_reward: bool = True
    kl_penalty: str = "kl"
    clip_ratio: float = 0.2


def kl_penalty(logprob: torch.FloatTensor, ref_logprob: torch.FloatTensor, kl_penalty: str) -> torch.FloatTensor:
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty == "abs":
        return (logprob - ref_logprob).abs()
    raise NotImplementedError(kl_penalty)


def apply_kl_penalty(data: DataProto, kl_ctrl: AdaptiveKLController, kl_penalty_type: str = "kl"):
    response_mask = data.batch["response_mask"]
    token_level_scores = data.batch["token_level_scores"]
    batch_size = data.batch.batch_size[0]

    # error: KL006
    kld = kl_penalty(data.batch["old_log_probs"], data.batch["ref_log_prob"], kl_penalty=kl_penalty_type)
    kld = kld * response_mask
    beta = kl_ctrl.value
    token_level_rewards = token_level_scores + beta * kld

    current_kl = masked_mean(kld, mask=response_mask, axis=-1)
    current_kl = torch.mean(current_kl, dim=0).item()
    kl_ctrl.update(current_kl=current_kl, n_steps=batch_size)
    data.batch["token_level_rewards"] = token_level_rewards
    return data, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}


def compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma: float, lam: float):
    with torch.no_grad():
        values = values * response_mask
        nextvalues = 0
        lastgaelam = 0
        advantages_reversed = []
        for t in reversed(range(token_level_rewards.shape[-1])):
            delta = token_level_rewards[:, t] + gamma * nextvalues - values[:, t]
            lastgaelam = delta + gamma * lam * lastgaelam
            nextvalues = values[:, t]
            advantages_reversed.append(lastgaelam)
        advantages = torch.stack(advantages_reversed[::-1], dim=1)
        returns = advantages + values
    return advantages * response_mask, returns


def compute_policy_loss(old_log_prob, log_prob, advantages, response_mask, cliprange: float):
    negative_approx_kl = log_prob - old_log_prob
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)
    pg_losses = torch.maximum(pg_losses1, pg_losses2)
    return (pg_losses * response_mask).sum(-1).mean()


def fit_step(batch: DataProto, actor, critic, kl_ctrl_in_reward, config: AlgorithmConfig):
    batch.batch["values"] = critic.compute_values(batch)
    if config.use_kl_in_reward:
        batch, kl_metrics = apply_kl_penalty(batch, kl_ctrl=kl_ctrl_in_reward, kl_penalty_type=config.kl_penalty)
    else:
        batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
    advantages, returns = compute_gae_advantage_return(
        batch.batch["token_level_rewards"], batch.batch["values"], batch.batch["response_mask"], config.gamma, config.lam
    )
    batch.batch["advantages"], batch.batch["returns"] = advantages, returns

    log_prob = actor.compute_log_prob(batch, with_grad=True)
    loss = compute_policy_loss(batch.batch["old_log_probs"], log_prob, advantages, batch.batch["response_mask"], config.clip_ratio)
    actor.optimizer.zero_grad()
    loss.backward()
    actor.optimizer.step()
    return loss.item()
