# Reviewer: the driver. fit() calls apply_kl_penalty with the config's estimator
# (ppo_trainer.yaml: low_var_kl); the k3 becomes the token-level rewards, credited by
# returns in compute_advantage: KL004 where apply_kl_penalty computes the estimate.
"""PPO driver: rollouts, KL rewards, advantages, actor updates."""

import hydra
import torch

from verl import DataProto
from verl.utils.torch_functional import masked_mean

from . import core_algos


def apply_kl_penalty(data: DataProto, kl_ctrl, kl_penalty: str = "kl"):
    response_mask = data.batch["response_mask"]
    token_level_scores = data.batch["token_level_scores"]
    batch_size = data.batch.batch_size[0]
    # error: KL004
    kld = core_algos.kl_penalty(data.batch["old_log_probs"], data.batch["ref_log_prob"], kl_penalty=kl_penalty)
    kld = kld * response_mask
    beta = kl_ctrl.value
    token_level_rewards = token_level_scores - beta * kld
    current_kl = masked_mean(kld, mask=response_mask, axis=-1).mean().item()
    kl_ctrl.update(current_kl=current_kl, n_steps=batch_size)
    data.batch["token_level_rewards"] = token_level_rewards
    return data, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}


def compute_advantage(data: DataProto, adv_estimator: str):
    if adv_estimator == "reinforce":
        advantages, returns = core_algos.compute_reinforce_advantage(data.batch["token_level_rewards"], data.batch["response_mask"])
    else:
        raise NotImplementedError(f"unsupported adv_estimator {adv_estimator}")
    data.batch["advantages"] = advantages
    data.batch["returns"] = returns
    return data


class RayPPOTrainer:
    def __init__(self, config, actor_rollout_wg, ref_policy_wg, reward_fn):
        self.config = config
        self.actor_rollout_wg = actor_rollout_wg
        self.ref_policy_wg = ref_policy_wg
        self.reward_fn = reward_fn
        if config.algorithm.use_kl_in_reward:
            self.kl_ctrl_in_reward = core_algos.get_kl_controller(config.algorithm.kl_ctrl)

    def fit(self, dataloader):
        metrics = {}
        for batch_dict in dataloader:
            batch = DataProto.from_single_dict(batch_dict)
            batch = batch.union(self.actor_rollout_wg.generate_sequences(batch))
            batch = batch.union(self.actor_rollout_wg.compute_log_prob(batch))
            batch = batch.union(self.ref_policy_wg.compute_ref_log_prob(batch))
            batch.batch["token_level_scores"] = self.reward_fn(batch)
            if self.config.algorithm.use_kl_in_reward:
                batch, kl_metrics = apply_kl_penalty(batch, kl_ctrl=self.kl_ctrl_in_reward, kl_penalty=self.config.algorithm.kl_penalty)
                metrics.update(kl_metrics)
            else:
                batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
            batch = compute_advantage(batch, adv_estimator=self.config.algorithm.adv_estimator)
            actor_output = self.actor_rollout_wg.update_actor(batch)
            metrics.update(actor_output.meta_info["metrics"])
        return metrics


@hydra.main(config_path=".", config_name="ppo_trainer", version_base=None)
def main(config):
    torch.manual_seed(0)
    return config
