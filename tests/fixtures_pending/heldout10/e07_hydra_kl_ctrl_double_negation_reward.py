"""REINFORCE with a per-token KL reward, config read from a Hydra-style dict.  The
k1 log-ratio is computed under no_grad and turned into `kl_penalty = -kl_ctrl.value * kl`,
but the rewards then *subtract* that penalty, so `+beta * kl` is added to the rewards and
credited by returns: the loss's expected gradient is -beta * grad KL(pi||pi_ref) and
descent increases the KL (KL006, reported at the estimate).
"""
import torch

DEFAULT_CFG = {
    "algorithm": {
        "use_kl_in_reward": True,
        "kl_ctrl": {"type": "adaptive", "kl_coef": 0.05, "target_kl": 0.1, "horizon": 10000},
    },
    "actor": {"loss_agg_mode": "seq-mean-token-sum"},
}


class AdaptiveKLController:
    def __init__(self, init_kl_coef, target_kl, horizon):
        self.value = init_kl_coef
        self.target = target_kl
        self.horizon = horizon

    def update(self, current_kl, n_steps):
        err = max(min(current_kl / self.target - 1, 0.2), -0.2)
        self.value *= 1 + err * n_steps / self.horizon


def get_kl_controller(kl_ctrl_cfg):
    if kl_ctrl_cfg["type"] == "adaptive":
        return AdaptiveKLController(kl_ctrl_cfg["kl_coef"], kl_ctrl_cfg["target_kl"], kl_ctrl_cfg["horizon"])
    raise NotImplementedError(kl_ctrl_cfg["type"])


def apply_kl_penalty(data, kl_ctrl):
    response_mask = data["response_mask"]
    with torch.no_grad():
        # error: KL006
        kld = (data["old_log_probs"] - data["ref_log_prob"]) * response_mask
        kl_penalty = -kl_ctrl.value * kld
        token_level_rewards = data["token_level_scores"] - kl_penalty
    data["token_level_rewards"] = token_level_rewards
    current_kl = (kld.sum(-1) / response_mask.sum(-1)).mean().item()
    kl_ctrl.update(current_kl, n_steps=response_mask.shape[0])
    return data


def compute_reinforce_returns(token_level_rewards, response_mask):
    with torch.no_grad():
        returns = (token_level_rewards * response_mask).flip(-1).cumsum(-1).flip(-1)
    return returns


def actor_loss(log_prob, returns, response_mask):
    return -(returns * log_prob * response_mask).sum(-1).mean()


def fit_step(cfg, kl_ctrl, data, actor, optimizer):
    if cfg["algorithm"]["use_kl_in_reward"]:
        data = apply_kl_penalty(data, kl_ctrl)
    else:
        data["token_level_rewards"] = data["token_level_scores"]
    returns = compute_reinforce_returns(data["token_level_rewards"], data["response_mask"])
    log_prob = actor(data["input_ids"])
    loss = actor_loss(log_prob, returns, data["response_mask"])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
