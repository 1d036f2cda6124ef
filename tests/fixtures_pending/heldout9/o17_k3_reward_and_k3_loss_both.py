"""REINFORCE++-style trainer that uses k3 *both* as a per-token reward and as a per-token loss.

With `KLConfig(in_reward=True, in_loss=True)` and one shared coefficient, the
detached k3 of each token is a reward (-coef * k3_t, credited by the reward-to-go
`returns`), and the k3 of the fresh log-probs is also added to the per-token
loss. The task score gets a leave-one-out baseline before it is placed on the
last token.

Correct, although each part alone is wrong: the k3 reward contributes
coef * E[sum_t grad logp_t sum_{s>=t} k3_s] = coef * (grad KL(pi||pi_ref) -
P), with P = E[sum_t (1 - exp(-logr_t)) grad logp_t] the token-level gradient of
KL(pi_ref||pi); the differentiated k3 loss contributes exactly coef * P. Their
sum is coef * grad KL(pi||pi_ref) of the sequence (Tang & Munos; the "both"
row of docs/maths.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


def k3_estimate(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    back = ref_logp - logp
    # ok: KL002
    return back.exp() - back - 1


@dataclass
class KLConfig:
    coef: float = 0.01
    in_reward: bool = True
    in_loss: bool = True


@dataclass
class TrainerConfig:
    n_samples_per_prompt: int = 4
    clip_eps: float = 0.2
    kl: KLConfig = field(default_factory=KLConfig)


class ReinforcePlusPlusTrainer:
    def __init__(self, actor, optimizer, cfg: TrainerConfig):
        self.actor = actor
        self.optimizer = optimizer
        self.cfg = cfg

    @torch.no_grad()
    def make_returns(self, batch: dict) -> torch.Tensor:
        mask = batch["action_mask"]
        n = self.cfg.n_samples_per_prompt
        scores = batch["scores"].view(-1, n)
        loo = (scores.sum(-1, keepdim=True) - scores) / (n - 1)
        score_adv = (scores - loo).view(-1)

        rewards = torch.zeros_like(batch["old_logprobs"])
        if self.cfg.kl.in_reward:
            # ok: KL004
            rewards = rewards - self.cfg.kl.coef * k3_estimate(batch["old_logprobs"], batch["ref_logprobs"]) * mask
        last = mask.sum(-1).long() - 1
        rewards[torch.arange(rewards.shape[0]), last] += score_adv
        return rewards.flip(-1).cumsum(-1).flip(-1) * mask

    def policy_loss(self, logprobs: torch.Tensor, batch: dict, returns: torch.Tensor) -> torch.Tensor:
        mask = batch["action_mask"]
        ratio = torch.exp(logprobs - batch["old_logprobs"])
        pg = -torch.min(ratio * returns, ratio.clamp(1 - self.cfg.clip_eps, 1 + self.cfg.clip_eps) * returns)
        per_token = pg
        if self.cfg.kl.in_loss:
            # ok: KL002
            per_token = per_token + self.cfg.kl.coef * k3_estimate(logprobs, batch["ref_logprobs"])
        return (per_token * mask).sum(-1).mean()

    def step(self, batch: dict) -> float:
        returns = self.make_returns(batch)
        n = batch["action_mask"].shape[1]
        logits = self.actor(batch["sequences"], attention_mask=batch["attention_mask"]).logits[:, -n - 1 : -1]
        logprobs = logits.log_softmax(-1).gather(-1, batch["sequences"][:, -n:, None]).squeeze(-1)
        loss = self.policy_loss(logprobs, batch, returns)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.item()
