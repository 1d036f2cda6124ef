# Reviewer: OpenRLHF-style PPO with a critic, where compute_reward forms the KL estimate
# itself from the log-probs it is given. Default args: kl_estimator="k3", init_kl_coef=0.02,
# use_kl_loss=False, gamma = lambd = 1. make_experience (no_grad) calls compute_reward with
# kl_estimator=self.args.kl_estimator, so every token's reward gets -kl_coef * k3, and GAE
# credits it as a reward-to-go. A k3 reward's expected gradient is grad KL(pi||pi_ref) minus
# the token-level partial gradient of KL(pi_ref||pi): biased (near zero near the reference).
# The k3 loss half (use_kl_loss) is off by default, so nothing pairs with the reward.
# The critic's value loss fits returns that hold the k3 and trains the value head only.
# Verdict: bug, KL004, reported inside compute_reward, on its line that calls
# compute_approx_kl (the estimator comes from the config, not a literal at the call).
from dataclasses import dataclass

import torch

import ray  # noqa: F401
from openrlhf.utils.deepspeed import DeepspeedStrategy  # noqa: F401


@dataclass
class Args:
    init_kl_coef: float = 0.02
    kl_estimator: str = "k3"
    use_kl_loss: bool = False
    gamma: float = 1.0
    lambd: float = 1.0
    eps_clip: float = 0.2
    value_clip: float = 0.2
    vf_coef: float = 0.5
    generate_max_len: int = 1024


def compute_approx_kl(log_probs, log_probs_base, kl_estimator="k1"):
    log_ratio = log_probs.float() - log_probs_base.float()
    if kl_estimator == "k2":
        log_ratio = log_ratio**2 / 2.0
    elif kl_estimator == "k3":
        log_ratio = -log_ratio.clamp(min=-20, max=20)
        # ok: KL004
        log_ratio = log_ratio.exp() - 1 - log_ratio
    return log_ratio


def compute_reward(r, kl_coef, log_probs, base_log_probs, action_mask, kl_estimator="k1"):
    # error: KL004
    kl = compute_approx_kl(log_probs, base_log_probs, kl_estimator=kl_estimator)
    kl_reward = -kl_coef * kl * action_mask
    eos_indices = action_mask.size(1) - 1 - action_mask.long().fliplr().argmax(dim=1, keepdim=True)
    last_reward = torch.zeros_like(kl).scatter_(dim=1, index=eos_indices, src=r.unsqueeze(1).to(kl.dtype))
    return last_reward + kl_reward, kl


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
    return advantages.detach(), (advantages + values).detach()


class ActorCriticPPO:
    def __init__(self, args: Args = None):
        self.args = args or Args()
        self.kl_coef = self.args.init_kl_coef

    @torch.no_grad()
    def make_experience(self, action_log_probs, base_action_log_probs, values, r, action_mask):
        rewards, kl = compute_reward(
            r, self.kl_coef, action_log_probs, base_action_log_probs, action_mask, kl_estimator=self.args.kl_estimator
        )
        advantages, returns = get_advantages_and_returns(values, rewards, action_mask, self.args.gamma, self.args.lambd)
        info = {"kl": (kl * action_mask).sum(-1) / action_mask.sum(-1), "reward": r}
        return {"advantages": advantages, "returns": returns, "values": values, "info": info}

    def ppo_loss(self, action_log_probs, old_action_log_probs, base_action_log_probs, values_pred, experience, action_mask):
        args = self.args
        norm = args.generate_max_len
        ratio = (action_log_probs - old_action_log_probs).exp()
        adv = experience["advantages"]
        surr = torch.min(ratio * adv, ratio.clamp(1 - args.eps_clip, 1 + args.eps_clip) * adv)
        actor_loss = -(surr * action_mask).sum(-1).mean() / norm
        if args.use_kl_loss:
            # ok: KL002
            kl = compute_approx_kl(action_log_probs, base_action_log_probs, kl_estimator=args.kl_estimator)
            actor_loss = actor_loss + self.kl_coef * (kl * action_mask).sum(-1).mean() / norm
        old_values, returns = experience["values"], experience["returns"]
        values_clipped = old_values + (values_pred - old_values).clamp(-args.value_clip, args.value_clip)
        # ok: KL005
        vf = torch.max((values_pred - returns) ** 2, (values_clipped - returns) ** 2)
        critic_loss = 0.5 * (vf * action_mask).sum(-1).mean() / norm
        loss = actor_loss + args.vf_coef * critic_loss
        return loss, {"actor_loss": actor_loss.item(), "critic_loss": critic_loss.item(), "kl_coef": self.kl_coef}
