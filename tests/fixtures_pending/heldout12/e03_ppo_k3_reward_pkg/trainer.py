from typing import Dict

import torch

from . import core_algos
from .config import load_config


def apply_kl_penalty(batch: Dict[str, torch.Tensor], kl_coef: float, kl_penalty: str = "kl") -> Dict[str, torch.Tensor]:
    response_mask = batch["response_mask"]
    # error: KL004
    kld = core_algos.kl_penalty(batch["old_log_probs"], batch["ref_log_prob"], kl_penalty=kl_penalty)
    kld = kld * response_mask
    batch["token_level_rewards"] = batch["token_level_scores"] - kl_coef * kld
    batch["kl_metric"] = kld.sum(-1).mean()
    return batch


class PPOTrainer:
    def __init__(self, actor, ref_policy, critic, reward_fn, config=None):
        self.actor, self.ref_policy, self.critic = actor, ref_policy, critic
        self.reward_fn = reward_fn
        self.config = config if config is not None else load_config()

    def _log_probs(self, model, input_ids, response_length: int) -> torch.Tensor:
        logits = model(input_ids=input_ids).logits[:, -response_length - 1 : -1]
        return torch.log_softmax(logits.float(), dim=-1).gather(-1, input_ids[:, -response_length:, None]).squeeze(-1)

    @torch.no_grad()
    def make_experience(self, input_ids: torch.Tensor, response_length: int) -> Dict[str, torch.Tensor]:
        algo = self.config.algorithm
        response_mask = torch.ones(input_ids.shape[0], response_length)
        batch = {
            "input_ids": input_ids,
            "response_mask": response_mask,
            "old_log_probs": self._log_probs(self.actor, input_ids, response_length),
            "ref_log_prob": self._log_probs(self.ref_policy, input_ids, response_length),
            "values": self.critic(input_ids=input_ids).values[:, -response_length - 1 : -1],
        }
        scores = self.reward_fn(input_ids)
        token_level_scores = torch.zeros_like(response_mask)
        token_level_scores[:, -1] = scores
        batch["token_level_scores"] = token_level_scores
        if algo.use_kl_in_reward:
            batch = apply_kl_penalty(batch, kl_coef=algo.kl_ctrl.kl_coef, kl_penalty=algo.kl_penalty)
        else:
            batch["token_level_rewards"] = token_level_scores
        batch["advantages"], batch["returns"] = core_algos.compute_gae_advantage_return(
            batch["token_level_rewards"], batch["values"], response_mask, gamma=algo.gamma, lam=algo.lam
        )
        return batch

    def update_actor(self, batch: Dict[str, torch.Tensor]) -> float:
        actor_cfg = self.config.actor
        response_length = batch["response_mask"].shape[1]
        n = batch["input_ids"].shape[0]
        mbs = actor_cfg.ppo_micro_batch_size
        total = 0.0
        for start in range(0, n, mbs):
            mb = {k: v[start : start + mbs] for k, v in batch.items() if torch.is_tensor(v) and v.dim() > 0}
            log_prob = self._log_probs(self.actor, mb["input_ids"], response_length)
            pg_loss = core_algos.compute_policy_loss(
                mb["old_log_probs"], log_prob, mb["advantages"], mb["response_mask"],
                cliprange=actor_cfg.clip_ratio, loss_agg_mode=actor_cfg.loss_agg_mode,
            )
            loss = pg_loss * mb["input_ids"].shape[0] / n
            loss.backward()
            total += loss.item()
        return total
