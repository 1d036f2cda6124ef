# Reviewer: AReaL-style PPO actor. KLEstimator is a str Enum whose `_missing_` hook lower-cases,
# maps "-" to "_" and resolves aliases; the default "Sequence-MSE" becomes SEQ_K2 (k2 of the
# sequence log-ratio, a correct estimator). But the KL term is computed by `_kl_term`, which is
# decorated with @torch.no_grad() (it was written for the stats pass), and its result is then
# added to the loss: the term has no gradient path, its gradient is exactly zero.
# Verdict: bug, KL005, reported where ppo_update_loss calls self._kl_term(...).
from dataclasses import dataclass
from enum import Enum

import torch

from areal.api.cli_args import PPOActorConfig as _AReaLActorConfig  # noqa: F401
from areal.utils import stats_tracker


class KLEstimator(str, Enum):
    K1 = "k1"
    K2 = "k2"
    K3 = "k3"
    SEQ_K2 = "seq_k2"

    @classmethod
    def _missing_(cls, value):
        key = str(value).strip().lower().replace("-", "_")
        key = {"kl": "k1", "mse": "k2", "low_var_kl": "k3", "seq_mse": "seq_k2", "sequence_mse": "seq_k2"}.get(key, key)
        for member in cls:
            if member.value == key:
                return member
        return None


KL_FNS = {
    KLEstimator.K1: lambda lp, ref, m: ((lp - ref) * m).sum(-1),
    KLEstimator.K2: lambda lp, ref, m: (0.5 * (lp - ref).square() * m).sum(-1),
    KLEstimator.K3: lambda lp, ref, m: ((torch.exp(ref - lp) - (ref - lp) - 1) * m).sum(-1),
    KLEstimator.SEQ_K2: lambda lp, ref, m: 0.5 * ((lp - ref) * m).sum(-1).square(),
}


@dataclass
class ActorConfig:
    kl_ctl: float = 0.1
    kl_estimator: str = "Sequence-MSE"
    eps_clip: float = 0.2


class PPOActor:
    def __init__(self, config: ActorConfig):
        self.config = config
        self.kl_estimator = KLEstimator(config.kl_estimator)

    @torch.no_grad()
    def _kl_term(self, logprobs, ref_logprobs, loss_mask):
        return KL_FNS[self.kl_estimator](logprobs, ref_logprobs, loss_mask)

    def ppo_update_loss(self, logprobs, old_logprobs, ref_logprobs, advantages, loss_mask):
        ratio = torch.exp(logprobs - old_logprobs)
        clipped = ratio.clamp(1.0 - self.config.eps_clip, 1.0 + self.config.eps_clip)
        pg_loss = torch.max(-advantages * ratio, -advantages * clipped)
        pg_loss = (pg_loss * loss_mask).sum(-1).mean()
        loss = pg_loss
        if self.config.kl_ctl > 0:
            # error: KL005
            kl = self._kl_term(logprobs, ref_logprobs, loss_mask)
            loss = loss + self.config.kl_ctl * kl.mean()
            self.last_stats = {"actor/kl": float(kl.mean()), "actor/pg_loss": float(pg_loss)}
        return loss
