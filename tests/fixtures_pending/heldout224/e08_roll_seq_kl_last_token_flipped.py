# Reviewer: ROLL-style PPO pipeline with a critic. Default PPOPipelineConfig:
# add_token_level_kl=False, so the KL reward is placed once, at the last response token:
# kl_placement="last", kl_coef=0.05, gamma = lambd = 1, reward clipping at +-10 on the score
# only, whiten_advantages=False. The sequence KL is written ref - logp,
# seq_kl = sum_t (ref_log_probs - old_log_probs), and the last-token reward is
# score - kl_coef * seq_kl: with the log-ratio the other way round, this ADDS
# kl_coef * sum_t log(pi/pi_ref) to the reward. GAE with gamma = lambd = 1 credits it to every
# token, so the minimised actor loss has the expected gradient -c * grad KL(pi||pi_ref),
# c > 0: a KL bonus. The critic loss fits those returns and trains the value model only.
# Verdict: bug, KL006, reported on the line that computes the estimate (seq_kl = ...).
from dataclasses import dataclass

import torch

from roll.distributed.scheduler.protocol import DataProto  # noqa: F401
from roll.utils.logging import get_logger  # noqa: F401


@dataclass
class PPOPipelineConfig:
    add_token_level_kl: bool = False
    kl_placement: str = "last"
    kl_coef: float = 0.05
    gamma: float = 1.0
    lambd: float = 1.0
    reward_clip: float = 10.0
    whiten_advantages: bool = False
    pg_clip: float = 0.2
    value_clip: float = 0.5
    sequence_length: int = 2048


def agg_loss(loss_mat, loss_mask, normaliser):
    # "seq-mean-token-sum-norm": sum over tokens, mean over sequences, constant normaliser
    return (loss_mat * loss_mask).sum(-1).mean() / normaliser


def masked_whiten(values, mask, eps=1e-8):
    mean = (values * mask).sum() / mask.sum()
    var = (((values - mean) ** 2) * mask).sum() / mask.sum()
    return (values - mean) * torch.rsqrt(var + eps)


def compute_token_reward(scores, old_log_probs, ref_log_probs, response_mask, cfg):
    scores = torch.clamp(scores, -cfg.reward_clip, cfg.reward_clip)
    token_rewards = torch.zeros_like(old_log_probs)
    last = response_mask.sum(-1).long() - 1
    rows = torch.arange(token_rewards.size(0))
    if cfg.add_token_level_kl or cfg.kl_placement == "every":
        token_rewards = -cfg.kl_coef * (old_log_probs - ref_log_probs) * response_mask
        token_rewards[rows, last] += scores
    else:
        # error: KL006
        seq_kl = ((ref_log_probs - old_log_probs) * response_mask).sum(-1)
        token_rewards[rows, last] = scores - cfg.kl_coef * seq_kl
    return token_rewards * response_mask


def compute_gae(token_rewards, values, response_mask, gamma, lambd):
    values = values * response_mask
    lastgaelam = torch.zeros_like(token_rewards[:, 0])
    advantages = torch.zeros_like(token_rewards)
    T = token_rewards.shape[1]
    for t in reversed(range(T)):
        nextvalues = values[:, t + 1] if t < T - 1 else torch.zeros_like(values[:, 0])
        delta = token_rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam = delta + gamma * lambd * lastgaelam
        advantages[:, t] = lastgaelam
    returns = advantages + values
    return advantages, returns


class PPOPipelineStep:
    def __init__(self, cfg: PPOPipelineConfig = None):
        self.cfg = cfg or PPOPipelineConfig()

    @torch.no_grad()
    def compute_advantage(self, batch):
        token_rewards = compute_token_reward(batch["scores"], batch["old_log_probs"], batch["ref_log_probs"], batch["response_mask"], self.cfg)
        advantages, returns = compute_gae(token_rewards, batch["values"], batch["response_mask"], self.cfg.gamma, self.cfg.lambd)
        if self.cfg.whiten_advantages:
            advantages = masked_whiten(advantages, batch["response_mask"])
        batch.update(token_rewards=token_rewards, advantages=advantages * batch["response_mask"], returns=returns)
        return batch

    def actor_loss(self, log_probs, batch):
        cfg = self.cfg
        ratio = torch.exp(log_probs - batch["old_log_probs"])
        surr1 = ratio * batch["advantages"]
        surr2 = ratio.clamp(1 - cfg.pg_clip, 1 + cfg.pg_clip) * batch["advantages"]
        return agg_loss(-torch.min(surr1, surr2), batch["response_mask"], cfg.sequence_length)

    def critic_loss(self, values_pred, batch):
        old_values, returns = batch["values"], batch["returns"]
        clipped = old_values + (values_pred - old_values).clamp(-self.cfg.value_clip, self.cfg.value_clip)
        # ok: KL005
        vf = torch.max((values_pred - returns) ** 2, (clipped - returns) ** 2)
        return 0.5 * agg_loss(vf, batch["response_mask"], self.cfg.sequence_length)

    def train_step(self, batch, log_probs, values_pred):
        batch = self.compute_advantage(batch)
        pg_loss = self.actor_loss(log_probs, batch)
        vf_loss = self.critic_loss(values_pred, batch)
        metrics = {"actor/pg_loss": pg_loss.item(), "critic/vf_loss": vf_loss.item(),
                   "critic/token_rewards": batch["token_rewards"].sum(-1).mean().item()}
        return pg_loss, vf_loss, metrics
