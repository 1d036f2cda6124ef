"""verl-style PPO driver with the KL to the reference placed in the token rewards.

The trainer's configuration is the nested ``DEFAULT_CONFIG`` dict (the shape
of verl's ``ppo_trainer.yaml``): the in-reward KL estimator is
``algorithm.kl_penalty``, the coefficient comes from a KL controller, and the
shaped ``token_level_rewards`` go through GAE (gamma = lam = 1) into the
advantages that weight the actor's log-probs in the clipped PPO loss.
"""

from typing import Any, Dict, Tuple

import torch

DEFAULT_CONFIG: Dict[str, Any] = {
    "algorithm": {
        "adv_estimator": "gae",
        "gamma": 1.0,
        "lam": 1.0,
        "use_kl_in_reward": True,
        "kl_penalty": "low_var_kl",
        "kl_ctrl": {"type": "fixed", "kl_coef": 0.05, "target_kl": 0.1, "horizon": 10000},
    },
    "actor": {"clip_ratio": 0.2, "ppo_micro_batch_size": 4},
}


class FixedKLController:
    def __init__(self, kl_coef: float):
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        pass


class AdaptiveKLController:
    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int):
        self.value = init_kl_coef
        self.target = target_kl
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        proportional_error = max(min(current_kl / self.target - 1, 0.2), -0.2)
        self.value *= 1 + proportional_error * n_steps / self.horizon


def get_kl_controller(kl_ctrl: Dict[str, Any]):
    if kl_ctrl["type"] == "fixed":
        return FixedKLController(kl_coef=kl_ctrl["kl_coef"])
    return AdaptiveKLController(kl_ctrl["kl_coef"], kl_ctrl["target_kl"], kl_ctrl["horizon"])


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis=None) -> torch.Tensor:
    if axis is None:
        return (values * mask).sum() / mask.sum().clamp(min=1.0)
    return (values * mask).sum(axis) / mask.sum(axis).clamp(min=1.0)


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        kl = torch.clamp(ref_logprob - logprob, min=-20, max=20)
        return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)
    raise NotImplementedError(kl_penalty)


def compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma: float, lam: float):
    with torch.no_grad():
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


def ppo_actor_loss(log_prob, old_log_prob, advantages, response_mask, clip_ratio: float) -> torch.Tensor:
    ratio = torch.exp(log_prob - old_log_prob)
    pg_losses = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1.0 - clip_ratio, 1.0 + clip_ratio)
    return masked_mean(torch.maximum(pg_losses, pg_losses2), response_mask)


class RayPPOTrainer:
    def __init__(self, actor, critic, actor_optimizer, config: Dict[str, Any] = DEFAULT_CONFIG):
        self.actor = actor
        self.critic = critic
        self.actor_optimizer = actor_optimizer
        self.config = config
        self.kl_ctrl_in_reward = get_kl_controller(config["algorithm"]["kl_ctrl"])

    def apply_kl_penalty(self, data: Dict[str, torch.Tensor]) -> Tuple[Dict[str, torch.Tensor], Dict[str, float]]:
        response_mask = data["response_mask"]
        token_level_scores = data["token_level_scores"]
        batch_size = token_level_scores.shape[0]
        # error: KL004
        kld = kl_penalty(data["old_log_probs"], data["ref_log_prob"], kl_penalty=self.config["algorithm"]["kl_penalty"])
        kld = kld * response_mask
        beta = self.kl_ctrl_in_reward.value
        data["token_level_rewards"] = token_level_scores - beta * kld
        current_kl = masked_mean(kld, response_mask, axis=-1).mean().item()
        self.kl_ctrl_in_reward.update(current_kl=current_kl, n_steps=batch_size)
        return data, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}

    def compute_advantage(self, data: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        algo = self.config["algorithm"]
        advantages, returns = compute_gae_advantage_return(
            data["token_level_rewards"], data["values"], data["response_mask"], gamma=algo["gamma"], lam=algo["lam"]
        )
        data["advantages"] = advantages
        data["returns"] = returns
        return data

    def update_actor(self, data: Dict[str, torch.Tensor]) -> float:
        mbs = self.config["actor"]["ppo_micro_batch_size"]
        total = 0.0
        self.actor_optimizer.zero_grad()
        n = data["responses"].shape[0]
        for start in range(0, n, mbs):
            mb = {k: v[start : start + mbs] for k, v in data.items()}
            logits = self.actor(mb["input_ids"]).logits[:, -mb["responses"].shape[1] - 1 : -1]
            log_prob = torch.gather(torch.log_softmax(logits, -1), 2, mb["responses"].unsqueeze(-1)).squeeze(-1)
            loss = ppo_actor_loss(log_prob, mb["old_log_probs"], mb["advantages"], mb["response_mask"], self.config["actor"]["clip_ratio"])
            (loss * mb["responses"].shape[0] / n).backward()
            total += loss.item()
        self.actor_optimizer.step()
        return total

    def fit_step(self, data: Dict[str, torch.Tensor]) -> Dict[str, float]:
        metrics: Dict[str, float] = {}
        with torch.no_grad():
            data["values"] = self.critic(data["input_ids"]).values[:, -data["responses"].shape[1] :]
        if self.config["algorithm"]["use_kl_in_reward"]:
            data, kl_metrics = self.apply_kl_penalty(data)
            metrics.update(kl_metrics)
        else:
            data["token_level_rewards"] = data["token_level_scores"]
        data = self.compute_advantage(data)
        metrics["actor/loss"] = self.update_actor(data)
        return metrics
