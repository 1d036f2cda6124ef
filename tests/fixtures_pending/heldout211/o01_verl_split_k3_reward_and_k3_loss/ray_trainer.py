# Reviewer: the driver of the recipe (see __init__.py). By default apply_kl_penalty
# puts -0.001 * k3(old_log_probs, ref) in the token rewards; REINFORCE++ returns
# (gamma=1, not whitened) credit each token with the k3 of itself and later tokens.
# Alone this is KL004; with the worker's k3 loss of the same coefficient it is the
# correct "both" pairing.
# Verdict: correct; the k3 reward stays silent.
import torch

from verl.utils.tracking import Tracking  # noqa: F401  (logging only, not used here)


class FixedKLController:
    def __init__(self, kl_coef):
        self.value = kl_coef

    def update(self, current_kl, n_steps):
        pass


def kl_estimate(logprob, ref_logprob, kl_penalty="kl"):
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        kl = torch.clamp(ref_logprob - logprob, min=-20, max=20)
        return torch.exp(kl) - kl - 1
    raise NotImplementedError(kl_penalty)


def apply_kl_penalty(data, kl_ctrl, kl_penalty="kl"):
    mask = data.batch["response_mask"]
    # ok: KL004
    kld = kl_estimate(data.batch["old_log_probs"], data.batch["ref_log_prob"], kl_penalty=kl_penalty)
    data.batch["token_level_rewards"] = data.batch["token_level_scores"] - kl_ctrl.value * kld * mask
    current_kl = ((kld * mask).sum(-1) / mask.sum(-1)).mean().item()
    return data, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": kl_ctrl.value}


def compute_advantage(data, adv_estimator, gamma=1.0, whiten=False):
    rewards, mask = data.batch["token_level_rewards"], data.batch["response_mask"]
    if adv_estimator != "reinforce_plus_plus":
        raise NotImplementedError(adv_estimator)
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
        running = running * mask[:, t]
    advantages = returns * mask
    if whiten:
        advantages = (advantages - advantages[mask.bool()].mean()) / (advantages[mask.bool()].std() + 1e-8) * mask
    data.batch["advantages"], data.batch["returns"] = advantages, returns
    return data


class RayPPOTrainer:
    def __init__(self, config, actor_rollout_wg, ref_policy_wg, reward_fn):
        self.config = config
        self.actor_rollout_wg, self.ref_policy_wg, self.reward_fn = actor_rollout_wg, ref_policy_wg, reward_fn
        algo = config.algorithm
        self.use_reference_policy = algo.use_kl_in_reward or config.actor.use_kl_loss
        self.kl_ctrl_in_reward = FixedKLController(algo.kl_ctrl.kl_coef)

    def fit(self, dataloader):
        algo, metrics = self.config.algorithm, {}
        for batch in dataloader:
            batch.batch.update(self.actor_rollout_wg.generate_sequences(batch).batch)
            batch.batch.update(self.actor_rollout_wg.compute_log_prob(batch).batch)
            if self.use_reference_policy:
                batch.batch.update(self.ref_policy_wg.compute_ref_log_prob(batch).batch)
            batch.batch["token_level_scores"] = self.reward_fn(batch)
            if algo.use_kl_in_reward:
                batch, kl_metrics = apply_kl_penalty(batch, self.kl_ctrl_in_reward, kl_penalty=algo.kl_penalty)
                metrics.update(kl_metrics)
            else:
                batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
            batch = compute_advantage(batch, algo.adv_estimator, gamma=algo.gamma, whiten=algo.whiten_advantages)
            metrics.update(self.actor_rollout_wg.update_actor(batch))
        return metrics
