# Reviewer: estimators, KL controllers, returns and the clipped policy loss. kl_penalty
# only returns the per-token estimate its `kl_penalty` string names.
"""Core functions of the PPO family (trimmed from verl.trainer.ppo.core_algos)."""

import torch


class FixedKLController:
    def __init__(self, kl_coef: float):
        self.value = kl_coef

    def update(self, current_kl, n_steps):
        pass


class AdaptiveKLController:
    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int):
        self.value = init_kl_coef
        self.target = target_kl
        self.horizon = horizon

    def update(self, current_kl, n_steps):
        proportional_error = max(min(current_kl / self.target - 1, 0.2), -0.2)
        self.value *= 1 + proportional_error * n_steps / self.horizon


def get_kl_controller(kl_ctrl):
    if kl_ctrl.type == "fixed":
        return FixedKLController(kl_coef=kl_ctrl.kl_coef)
    if kl_ctrl.type == "adaptive":
        if kl_ctrl.horizon <= 0:
            raise ValueError(f"horizon must be larger than 0, got {kl_ctrl.horizon}")
        return AdaptiveKLController(init_kl_coef=kl_ctrl.kl_coef, target_kl=kl_ctrl.target_kl, horizon=kl_ctrl.horizon)
    raise NotImplementedError(f"unknown kl_ctrl type {kl_ctrl.type}")


def kl_penalty(logprob: torch.FloatTensor, ref_logprob: torch.FloatTensor, kl_penalty: str) -> torch.FloatTensor:
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty == "abs":
        return (logprob - ref_logprob).abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        kl = torch.clamp(ref_logprob - logprob, min=-20, max=20)
        return torch.exp(kl) - kl - 1
    if kl_penalty == "full":
        raise NotImplementedError
    raise NotImplementedError(f"unknown kl_penalty {kl_penalty}")


def compute_reinforce_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor):
    with torch.no_grad():
        returns = (token_level_rewards * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
        advantages = returns * response_mask
    return advantages, returns


def compute_policy_loss(old_log_prob, log_prob, advantages, response_mask, cliprange=0.2):
    ratio = torch.exp(log_prob - old_log_prob)
    pg_losses = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)
    return (torch.maximum(pg_losses, pg_losses2) * response_mask).sum(dim=-1).mean()
