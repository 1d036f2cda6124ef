# Reviewer: OpenRLHF-style actor whose KL loss is a small pipeline of composed
# functions: compose(k3, mask, token_sum, batch_mean) applied to the log-ratio of
# the fresh action log-probs and the reference's. The first stage is the k3
# estimate spelled expm1(-x) + x, with the gradient of the policy log-probs, and
# it is summed over the action tokens: the expected gradient is the token-level
# gradient of KL(pi_ref||pi), not grad KL(pi||pi_ref).
# Verdict: bug, KL002, reported on the line of the loss that builds and calls the
# pipeline (the helper that returns the estimate is called there).
from functools import partial, reduce

import torch
import torch.nn as nn

from openrlhf.models import Actor
from openrlhf.models.utils import masked_mean


def compose(*fns):
    """compose(f, g, h)(x) == h(g(f(x)))"""
    return reduce(lambda f, g: lambda x: g(f(x)), fns)


def k2(log_ratio):
    return 0.5 * log_ratio.square()


def k3(log_ratio):
    log_ratio = log_ratio.clamp(min=-20.0, max=20.0)
    return torch.expm1(-log_ratio) + log_ratio


class PolicyLoss(nn.Module):
    def __init__(self, clip_eps: float = 0.2):
        super().__init__()
        self.clip_eps = clip_eps

    def forward(self, log_probs, old_log_probs, advantages, action_mask):
        ratio = (log_probs - old_log_probs).exp()
        surr1 = ratio * advantages
        surr2 = ratio.clamp(1 - self.clip_eps, 1 + self.clip_eps) * advantages
        return (-torch.min(surr1, surr2) * action_mask).sum(-1).mean()


class FunctionalActorTrainer:
    def __init__(self, actor: Actor, init_kl_coef: float = 0.01):
        self.actor = actor
        self.kl_coef = init_kl_coef
        self.policy_loss_fn = PolicyLoss()

    def actor_loss(self, action_log_probs, old_action_log_probs, base_action_log_probs, advantages, action_mask):
        actor_loss = self.policy_loss_fn(action_log_probs, old_action_log_probs, advantages, action_mask)
        # ok: KL001
        log_ratio = action_log_probs - base_action_log_probs
        # error: KL002
        kl_loss = compose(k3, partial(torch.mul, action_mask), partial(torch.sum, dim=-1), torch.mean)(log_ratio)
        loss = actor_loss + self.kl_coef * kl_loss
        status = {"policy_loss": actor_loss.item(), "kl": kl_loss.item()}
        return loss, status

    def training_step(self, experience):
        self.actor.train()
        action_log_probs = self.actor(experience.sequences, experience.num_actions, attention_mask=experience.attention_mask)
        loss, status = self.actor_loss(
            action_log_probs,
            experience.action_log_probs,
            experience.base_action_log_probs,
            experience.advantages,
            experience.action_mask,
        )
        loss.backward()
        status["response_length"] = masked_mean(experience.action_mask.float(), experience.action_mask).item()
        return status
