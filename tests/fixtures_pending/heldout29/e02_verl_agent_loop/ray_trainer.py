"""Driver: rollout-side log-probs, KL-in-reward, advantages, then the actor update."""
import torch

from . import core_algos


class DataProto:
    def __init__(self, batch, meta_info=None):
        self.batch = batch
        self.meta_info = meta_info or {}


def apply_kl_penalty(data, kl_ctrl, kl_penalty="low_var_kl"):
    """Token-level rewards = scores - beta * KL, on assistant tokens only."""
    response_mask = data.batch["response_mask"]
    token_level_scores = data.batch["token_level_scores"]
    # error: KL004
    kld = core_algos.kl_penalty(data.batch["old_log_probs"], data.batch["ref_log_prob"], kl_penalty=kl_penalty)
    kld = kld * response_mask
    beta = kl_ctrl.value
    token_level_rewards = token_level_scores - beta * kld
    current_kl = core_algos.masked_mean(kld, mask=response_mask, axis=-1).mean().item()
    kl_ctrl.update(current_kl=current_kl, n_steps=response_mask.shape[0])
    data.batch["token_level_rewards"] = token_level_rewards
    return data, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}


def compute_advantage(data, adv_estimator="gae", gamma=1.0, lam=1.0):
    adv_fn = core_algos.get_adv_estimator_fn(adv_estimator)
    if adv_estimator == "gae":
        advantages, returns = adv_fn(
            token_level_rewards=data.batch["token_level_rewards"],
            values=data.batch["values"],
            response_mask=data.batch["response_mask"],
            gamma=gamma,
            lam=lam,
        )
    else:
        advantages, returns = adv_fn(
            token_level_rewards=data.batch["token_level_rewards"],
            response_mask=data.batch["response_mask"],
            index=data.meta_info["uid"],
        )
    data.batch["advantages"] = advantages
    data.batch["returns"] = returns
    return data


class RayPPOTrainer:
    def __init__(self, actor, ref_policy, critic, kl_coef=0.001, use_kl_in_reward=True, kl_penalty="low_var_kl", adv_estimator="gae", gamma=1.0, lam=1.0):
        self.actor = actor
        self.ref_policy = ref_policy
        self.critic = critic
        self.kl_ctrl_in_reward = core_algos.FixedKLController(kl_coef)
        self.use_kl_in_reward = use_kl_in_reward
        self.kl_penalty = kl_penalty
        self.adv_estimator = adv_estimator
        self.gamma = gamma
        self.lam = lam

    def step(self, data):
        with torch.no_grad():
            data.batch["old_log_probs"] = self.actor.compute_log_prob(data)
            data.batch["ref_log_prob"] = self.ref_policy.compute_log_prob(data)
            data.batch["values"] = self.critic(data.batch)
        if self.use_kl_in_reward:
            data, _ = apply_kl_penalty(data, self.kl_ctrl_in_reward, kl_penalty=self.kl_penalty)
        else:
            data.batch["token_level_rewards"] = data.batch["token_level_scores"]
        data = compute_advantage(data, adv_estimator=self.adv_estimator, gamma=self.gamma, lam=self.lam)
        return self.actor.update_policy(data)
