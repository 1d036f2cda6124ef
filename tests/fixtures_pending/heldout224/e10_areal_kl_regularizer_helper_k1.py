# Reviewer: AReaL-style PPO actor + critic interface (legacy realhf ppo_interface). Default
# PPOHyperparameters: kl_ctl=0.1, use_kl_in_reward=False (this fork regularises with a loss
# term instead), gamma = lam = 1, value_norm=False. The task reward goes through GAE; the
# actor loss calls self._kl_regularizer once, a loss helper that no parameter steers and
# that reduces kl_ctl * sum_t (logprobs - ref_logprobs) into a loss of its own. That is the
# k1 estimate with gradient: autograd gives grad logp, whose expectation under y ~ pi is zero,
# so the KL term does nothing but add noise. The critic's loss fits GAE returns of the task
# reward and trains the critic only.
# Verdict: bug, KL001, reported inside _kl_regularizer, on the line that computes the
# estimate (the loss helper called from one place writes the wrong estimator there).
import dataclasses

import torch

from realhf.api.core.model_api import ReaLModelConfig  # noqa: F401
from realhf.base import stats_tracker  # noqa: F401


@dataclasses.dataclass
class PPOHyperparameters:
    eps_clip: float = 0.2
    value_eps_clip: float = 0.2
    kl_ctl: float = 0.1
    use_kl_in_reward: bool = False
    discount: float = 1.0
    gae_lambda: float = 1.0
    value_norm: bool = False
    max_new_tokens: int = 1024
    adv_norm: bool = False


def masked_normalization(x, mask, eps=1e-5):
    mean = (x * mask).sum() / mask.sum()
    var = (((x - mean) ** 2) * mask).sum() / mask.sum()
    return (x - mean) / (var.sqrt() + eps)


@torch.no_grad()
def get_packed_advantages_and_returns(gamma, lam, values, rewards, mask):
    T = rewards.shape[-1]
    advantages = torch.zeros_like(rewards)
    lastgaelam = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(T)):
        nextvalues = values[:, t + 1] * mask[:, t + 1] if t < T - 1 else torch.zeros_like(lastgaelam)
        delta = rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam = (delta + gamma * lam * lastgaelam) * mask[:, t]
        advantages[:, t] = lastgaelam
    return advantages, advantages + values * mask


class PPOActorCriticInterface:
    def __init__(self, hp: PPOHyperparameters = None):
        self.hp = hp or PPOHyperparameters()

    @torch.no_grad()
    def prepare(self, scores, old_logp, ref_logp, values, mask):
        hp = self.hp
        rewards = torch.zeros_like(old_logp)
        if hp.use_kl_in_reward:
            rewards = -hp.kl_ctl * (old_logp - ref_logp) * mask
        last = mask.sum(-1).long() - 1
        rewards[torch.arange(rewards.size(0)), last] += scores
        advantages, returns = get_packed_advantages_and_returns(hp.discount, hp.gae_lambda, values, rewards, mask)
        if hp.adv_norm:
            advantages = masked_normalization(advantages, mask)
        return advantages, returns

    def _kl_regularizer(self, logprobs, ref_logprobs, mask):
        # error: KL001
        return self.hp.kl_ctl * ((logprobs - ref_logprobs) * mask).sum(-1).mean() / self.hp.max_new_tokens

    def actor_loss(self, logprobs, old_logp, ref_logp, advantages, mask):
        hp = self.hp
        ratio = torch.exp(logprobs - old_logp)
        clipped_ratio = torch.clamp(ratio, 1.0 - hp.eps_clip, 1.0 + hp.eps_clip)
        pg_loss = torch.max(-advantages * ratio, -advantages * clipped_ratio)
        pg_loss = (pg_loss * mask).sum(-1).mean() / hp.max_new_tokens
        # ok: KL001
        kl_loss = self._kl_regularizer(logprobs, ref_logp, mask)
        return pg_loss + kl_loss, {"pg_loss": pg_loss.item(), "kl_loss": kl_loss.item()}

    def critic_loss(self, new_values, old_values, returns, mask):
        hp = self.hp
        clipped = old_values + (new_values - old_values).clamp(-hp.value_eps_clip, hp.value_eps_clip)
        loss = torch.max((new_values - returns) ** 2, (clipped - returns) ** 2)
        return 0.5 * (loss * mask).sum(-1).mean() / hp.max_new_tokens

    def train_step(self, batch, logprobs, new_values):
        advantages, returns = self.prepare(batch["scores"], batch["old_logp"], batch["ref_logp"], batch["values"], batch["mask"])
        a_loss, stats = self.actor_loss(logprobs, batch["old_logp"], batch["ref_logp"], advantages, batch["mask"])
        c_loss = self.critic_loss(new_values, batch["values"], returns, batch["mask"])
        stats["critic_loss"] = c_loss.item()
        return a_loss + c_loss, stats
