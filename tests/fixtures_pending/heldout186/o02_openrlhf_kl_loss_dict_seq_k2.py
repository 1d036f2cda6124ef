# Reviewer: OpenRLHF-style actor loss built from two nn.Modules that return dicts
# of terms, like e02. Here ActorLossArgs defaults to kl_estimator="k2" with
# kl_reduction="sequence": KLLoss sums the masked log-ratio over the response
# BEFORE applying the estimator, so the term is 0.5 * (sum_t logr_t)^2 per
# sequence (k2 of the sequence log-ratio), whose gradient is exactly
# grad KL(pi||pi_ref) of the sequence. The "k1" branch is not selected.
# Verdict: correct. The KLLoss call and the k2 branch stay silent.
from dataclasses import dataclass

import torch
import torch.nn as nn

from openrlhf.models.utils import masked_mean
from openrlhf.trainer.ppo_utils.experience_maker import Experience


@dataclass
class ActorLossArgs:
    eps_clip: float = 0.2
    init_kl_coef: float = 0.01
    use_kl_loss: bool = True
    kl_estimator: str = "k2"
    kl_reduction: str = "sequence"


class PolicyLoss(nn.Module):
    def __init__(self, clip_eps: float = 0.2):
        super().__init__()
        self.clip_eps = clip_eps

    def forward(self, log_probs, old_log_probs, advantages, action_mask):
        ratio = (log_probs - old_log_probs).exp()
        surr1 = ratio * advantages
        surr2 = ratio.clamp(1 - self.clip_eps, 1 + self.clip_eps) * advantages
        loss = (-torch.min(surr1, surr2) * action_mask).sum(-1).mean()
        clip_frac = ((surr2 < surr1).float() * action_mask).sum() / action_mask.sum().clamp(min=1)
        return {"loss": loss, "clip_frac": clip_frac.detach()}


class KLLoss(nn.Module):
    def __init__(self, kl_estimator: str = "k1", reduction: str = "token"):
        super().__init__()
        self.kl_estimator = kl_estimator
        self.reduction = reduction

    def _estimate(self, log_ratio):
        if self.kl_estimator == "k1":
            # ok: KL001
            return log_ratio
        if self.kl_estimator == "k2":
            # ok: KL003
            return log_ratio**2 / 2.0
        raise ValueError(self.kl_estimator)

    def forward(self, log_probs, base_log_probs, action_mask):
        log_ratio = log_probs.float() - base_log_probs.float()
        mask = action_mask
        if self.reduction == "sequence":
            log_ratio = (log_ratio * action_mask).sum(-1, keepdim=True)
            mask = torch.ones_like(log_ratio)
        kl = self._estimate(log_ratio)
        kl_loss = (kl * mask).sum(-1).mean()
        return {"kl_loss": kl_loss, "kl": (log_ratio.detach() * mask).sum(-1).mean()}


class ActorLossHead(nn.Module):
    def __init__(self, args: ActorLossArgs):
        super().__init__()
        self.args = args
        self.policy_loss = PolicyLoss(args.eps_clip)
        self.kl_loss = KLLoss(args.kl_estimator, args.kl_reduction)

    def forward(self, log_probs, experience: dict):
        mask = experience["action_mask"]
        out = self.policy_loss(log_probs, experience["action_log_probs"], experience["advantages"], mask)
        terms = {"policy_loss": out["loss"], "clip_frac": out["clip_frac"]}
        loss = out["loss"]
        if self.args.use_kl_loss:
            # ok: KL003
            kl_out = self.kl_loss(log_probs, experience["base_action_log_probs"], mask)
            loss = loss + self.args.init_kl_coef * kl_out["kl_loss"]
            terms["kl"] = kl_out["kl"]
        terms["loss"] = loss
        return terms


class ActorPPOTrainer:
    def __init__(self, actor, actor_optim, args: ActorLossArgs):
        self.actor = actor
        self.actor_optim = actor_optim
        self.loss_head = ActorLossHead(args)

    def training_step(self, experience: Experience):
        self.actor.train()
        log_probs = self.actor(experience.sequences, experience.action_mask.size(1), attention_mask=experience.attention_mask)
        terms = self.loss_head(log_probs, {
            "action_mask": experience.action_mask,
            "action_log_probs": experience.action_log_probs,
            "base_action_log_probs": experience.base_action_log_probs,
            "advantages": experience.advantages,
        })
        terms["loss"].backward()
        self.actor_optim.step()
        self.actor_optim.zero_grad()
        return {k: float(v) for k, v in terms.items()}
