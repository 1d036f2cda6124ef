# Reviewer: OpenRLHF-style PPO with a critic, the same skeleton as e02. Default PPOArgs:
# use_kl_loss=False, init_kl_coef=0.01, kl_estimator="k1". make_experience computes the k1
# log-ratio under no_grad and compute_reward subtracts kl_coef * k1 from every token's
# reward; GAE with gamma = lambd = 1 and values = critic output gives each token the KL of
# itself and of every later token (a reward-to-go), so the KL part of the PPO gradient is
# kl_coef / generate_max_len times grad KL(pi||pi_ref) of the sequence. The KL-loss branch of
# training_step is off by default. The value loss fits returns that hold the detached KL and
# trains the value head only.
# Verdict: correct. The in-reward compute_approx_kl call and the value loss stay silent.
from dataclasses import dataclass

import torch

from openrlhf.models import Actor  # noqa: F401
from openrlhf.trainer.ppo_utils import AdaptiveKLController  # noqa: F401


@dataclass
class PPOArgs:
    init_kl_coef: float = 0.01
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.01
    kl_estimator: str = "k1"
    gamma: float = 1.0
    lambd: float = 1.0
    eps_clip: float = 0.2
    value_clip: float = 0.2
    generate_max_len: int = 1024
    reward_clip_range: tuple = (-10.0, 10.0)


def compute_approx_kl(log_probs, log_probs_base, kl_estimator="k1"):
    log_ratio = log_probs.float() - log_probs_base.float()
    if kl_estimator == "k1":
        # ok: KL001
        return log_ratio
    if kl_estimator == "k2":
        return log_ratio**2 / 2.0
    if kl_estimator == "k3":
        log_ratio = -log_ratio.clamp(min=-20, max=20)
        return log_ratio.exp() - 1 - log_ratio
    raise ValueError(kl_estimator)


def compute_reward(r, kl_coef, kl, action_mask, reward_clip_range=None):
    if kl_coef <= 0.0:
        kl_coef = 0.0
    if reward_clip_range:
        r = r.clamp(min=reward_clip_range[0], max=reward_clip_range[1])
    kl_reward = -kl_coef * kl
    eos_indices = action_mask.size(1) - 1 - action_mask.long().fliplr().argmax(dim=1, keepdim=True)
    last_reward = torch.zeros_like(kl).scatter_(dim=1, index=eos_indices, src=r.unsqueeze(1).to(kl.dtype))
    return (last_reward + kl_reward) * action_mask


def get_advantages_and_returns(values, rewards, action_mask, gamma, lambd):
    lastgaelam = 0
    advantages_reversed = []
    response_length = rewards.size(1)
    values = action_mask * values
    rewards = action_mask * rewards
    for t in reversed(range(response_length)):
        nextvalues = values[:, t + 1] if t < response_length - 1 else 0.0
        delta = rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam = delta + gamma * lambd * lastgaelam
        advantages_reversed.append(lastgaelam)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)
    returns = advantages + values
    return advantages.detach(), returns.detach()


class PPOTrainerStep:
    def __init__(self, args: PPOArgs = None):
        self.args = args or PPOArgs()
        self.kl_coef = self.args.init_kl_coef

    @torch.no_grad()
    def make_experience(self, action_log_probs, base_action_log_probs, values, r, action_mask):
        # ok: KL001
        kl = compute_approx_kl(action_log_probs, base_action_log_probs, kl_estimator=self.args.kl_estimator)
        kl_coef = 0.0 if self.args.use_kl_loss else self.kl_coef
        rewards = compute_reward(r, kl_coef, kl, action_mask, self.args.reward_clip_range)
        advantages, returns = get_advantages_and_returns(values, rewards, action_mask, self.args.gamma, self.args.lambd)
        info = {"kl": (kl * action_mask).sum(-1) / action_mask.sum(-1), "reward": r}
        return {"advantages": advantages, "returns": returns, "values": values, "info": info}

    def policy_loss(self, log_probs, old_log_probs, advantages, action_mask):
        ratio = (log_probs - old_log_probs).exp()
        surr1 = ratio * advantages
        surr2 = ratio.clamp(1 - self.args.eps_clip, 1 + self.args.eps_clip) * advantages
        loss = -torch.min(surr1, surr2)
        return (loss * action_mask).sum(-1).mean() / self.args.generate_max_len

    def value_loss(self, values, old_values, returns, action_mask):
        values_clipped = old_values + (values - old_values).clamp(-self.args.value_clip, self.args.value_clip)
        # ok: KL005
        loss = torch.max((values_clipped - returns) ** 2, (values - returns) ** 2)
        return 0.5 * (loss * action_mask).sum(-1).mean() / self.args.generate_max_len

    def training_step(self, action_log_probs, old_action_log_probs, base_action_log_probs, experience, action_mask, values_pred):
        actor_loss = self.policy_loss(action_log_probs, old_action_log_probs, experience["advantages"], action_mask)
        if self.args.use_kl_loss:
            # ok: KL001
            kl = compute_approx_kl(action_log_probs, base_action_log_probs, kl_estimator=self.args.kl_estimator)
            kl_loss = (kl * action_mask).sum(-1).mean() / self.args.generate_max_len
        else:
            kl_loss = torch.zeros((), device=action_log_probs.device)
        critic_loss = self.value_loss(values_pred, experience["values"], experience["returns"], action_mask)
        loss = actor_loss + self.args.kl_loss_coef * kl_loss + critic_loss
        status = {"policy_loss": actor_loss.item(), "kl_loss": kl_loss.item(), "critic_loss": critic_loss.item()}
        return loss, status
