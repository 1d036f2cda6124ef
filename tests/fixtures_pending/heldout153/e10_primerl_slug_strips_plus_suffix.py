# Reviewer: prime-rl-style loss. The KL option is slugged into a method name for
# getattr(self, f"_kl_{slug}") dispatch: _slug() lower-cases and replaces every run of
# non-identifier characters by "_" and strips "_" at the ends, and only THEN looks up
# _ALIASES. The default "Low-Var-KL+" (meant: k3 value with a straight-through, reward-to-go
# gradient, `_kl_low_var_kl_st`) slugs to "low_var_kl", so the alias "low_var_kl+" never
# matches and plain per-token k3 is differentiated, summed over tokens: the token-level
# gradient of KL(pi_ref||pi).
# Verdict: bug, KL002, reported where compute_loss calls the dispatched helper.
import re
from dataclasses import dataclass

import torch

from prime_rl.trainer.rl.config import LossConfig as _PrimeLossConfig  # noqa: F401

_ALIASES = {"low_var_kl+": "low_var_kl_st", "k3+": "low_var_kl_st", "k3": "low_var_kl", "k1": "kl"}


def _slug(name: str) -> str:
    s = re.sub(r"[^0-9a-z_]+", "_", name.strip().lower()).strip("_")
    return _ALIASES.get(s, s)


@dataclass
class KLLossConfig:
    kl_tau: float = 0.05
    kl_type: str = "Low-Var-KL+"
    mask_ratio_high: float = 8.0


class RLLoss:
    def __init__(self, config: KLLossConfig):
        self.config = config
        self._kl_fn = getattr(self, f"_kl_{_slug(config.kl_type)}")

    def _kl_kl(self, logprobs, ref_logprobs, mask):
        return logprobs - ref_logprobs

    def _kl_low_var_kl(self, logprobs, ref_logprobs, mask):
        log_ratio = ref_logprobs - logprobs
        return torch.exp(log_ratio) - log_ratio - 1

    def _kl_low_var_kl_st(self, logprobs, ref_logprobs, mask):
        log_ratio = (logprobs - ref_logprobs).detach() * mask
        k3 = torch.exp(-log_ratio) + log_ratio - 1
        kl_to_go = log_ratio.flip(-1).cumsum(-1).flip(-1)
        return k3 + kl_to_go * (logprobs - logprobs.detach())

    def compute_loss(self, logprobs, old_logprobs, ref_logprobs, advantages, loss_mask):
        log_importance_ratio = logprobs - old_logprobs
        importance_ratio = torch.exp(log_importance_ratio)
        is_masked = (importance_ratio > self.config.mask_ratio_high).detach()
        keep = loss_mask & ~is_masked if loss_mask.dtype == torch.bool else loss_mask * (~is_masked).to(loss_mask.dtype)
        pg_loss = -(importance_ratio * advantages.unsqueeze(-1))
        # error: KL002
        kl = self._kl_fn(logprobs, ref_logprobs, loss_mask)
        per_token_loss = pg_loss * keep + self.config.kl_tau * kl * loss_mask
        return per_token_loss.sum(-1).mean()
