# Reviewer: SkyRL-style policy loss whose KL term dispatches on the type of a
# frozen spec object with `functools.singledispatchmethod`. The default spec,
# `AlgorithmConfig.kl_spec = ImportanceWeightedK3()`, selects the
# implementation that returns per-token `ratio * k3`, ratio = exp(logp -
# sg(logp)) (the importance-weighted k3 of newer GRPO variants). Per token its
# expected gradient is logr_t * grad logp_t, but summed over the response it
# keeps only each token's own log-ratio: a partial gradient of the sequence
# KL(pi||pi_ref), not the full one.
# Verdict: bug, KL003, reported where __call__ calls the dispatched helper
# (`kl = self.kl_loss(self.cfg.kl_spec, ...)`).
import functools
from dataclasses import dataclass, field

import torch

from skyrl_train.utils.ppo_utils import PolicyLossRegistry


@dataclass(frozen=True)
class K1Spec:
    pass


@dataclass(frozen=True)
class ImportanceWeightedK3:
    log_ratio_clip: float = 20.0


@dataclass
class AlgorithmConfig:
    eps_clip_low: float = 0.2
    eps_clip_high: float = 0.2
    kl_loss_coef: float = 0.001
    kl_spec: object = field(default_factory=ImportanceWeightedK3)
    max_seq_len: int = 1024


class PPOPolicyLoss:
    def __init__(self, cfg: AlgorithmConfig):
        self.cfg = cfg

    @functools.singledispatchmethod
    def kl_loss(self, spec, logprobs, ref_logprobs, mask):
        raise NotImplementedError(f"no KL loss for {type(spec).__name__}")

    @kl_loss.register
    def _(self, spec: K1Spec, logprobs, ref_logprobs, mask):
        # ok: KL001
        return logprobs - ref_logprobs

    @kl_loss.register
    def _(self, spec: ImportanceWeightedK3, logprobs, ref_logprobs, mask):
        log_ratio = (logprobs - ref_logprobs).clamp(-spec.log_ratio_clip, spec.log_ratio_clip)
        k3 = torch.exp(-log_ratio) + log_ratio - 1
        is_weight = torch.exp(logprobs - logprobs.detach())
        return is_weight * k3

    def __call__(self, logprobs, old_logprobs, ref_logprobs, advantages, loss_mask):
        cfg = self.cfg
        ratio = (logprobs - old_logprobs).exp()
        surr1 = ratio * advantages
        surr2 = ratio.clamp(1 - cfg.eps_clip_low, 1 + cfg.eps_clip_high) * advantages
        loss = -torch.min(surr1, surr2)
        if cfg.kl_loss_coef > 0:
            # error: KL003
            kl = self.kl_loss(self.cfg.kl_spec, logprobs, ref_logprobs, loss_mask)
            loss = loss + cfg.kl_loss_coef * kl
        # seq-mean-token-sum-norm: token sum per sequence over a constant
        loss = ((loss * loss_mask).sum(-1) / cfg.max_seq_len).mean()
        return loss


def ppo_train(policy, batch, cfg: AlgorithmConfig = AlgorithmConfig()):
    loss_fn = PPOPolicyLoss(cfg)
    logprobs = policy(batch["sequences"], batch["attention_mask"])
    loss = loss_fn(logprobs, batch["old_logprobs"], batch["ref_logprobs"], batch["advantages"], batch["loss_mask"])
    loss.backward()
    return {"policy_loss": loss.item()}
