"""Actor update with a KL loss picked from a nested (hydra-style) config."""
from types import SimpleNamespace
from typing import Callable, Dict

import torch

try:
    from omegaconf import OmegaConf
except ImportError:  # pragma: no cover - omegaconf is optional at test time
    OmegaConf = None

ACTOR_DEFAULTS = {
    "actor": {
        "clip_ratio": 0.2,
        "ppo_micro_batch_size": 4,
        "kl_loss": {"enable": True, "coef": 0.001, "type": "k3_is", "max_is_ratio": 10.0},
    }
}


def build_config(overrides: Dict = None):
    if OmegaConf is not None:
        return OmegaConf.merge(OmegaConf.create(ACTOR_DEFAULTS), OmegaConf.create(overrides or {}))
    def ns(d):
        return SimpleNamespace(**{k: ns(v) if isinstance(v, dict) else v for k, v in d.items()})
    return ns(ACTOR_DEFAULTS)


def _k1(log_prob, ref_log_prob, rollout_log_prob, max_is_ratio):
    return log_prob - ref_log_prob


def _k3(log_prob, ref_log_prob, rollout_log_prob, max_is_ratio):
    log_ratio = ref_log_prob - log_prob
    # ok: KL002
    return torch.exp(log_ratio) - log_ratio - 1


def _k3_is(log_prob, ref_log_prob, rollout_log_prob, max_is_ratio):
    """k3 importance-weighted by pi/pi_rollout, for off-policy (async) rollouts."""
    is_weight = torch.exp(log_prob - rollout_log_prob).clamp(max=max_is_ratio)
    log_ratio = ref_log_prob - log_prob
    # ok: KL003
    return is_weight * (torch.exp(log_ratio) - log_ratio - 1)


KL_LOSSES: Dict[str, Callable[..., torch.Tensor]] = {"k1": _k1, "k3": _k3, "low_var_kl": _k3, "k3_is": _k3_is}


def agg_loss(loss_mat: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """seq-mean-token-sum"""
    return (loss_mat * mask).sum(-1).mean()


class DataParallelActor:
    def __init__(self, module, config=None):
        self.module = module
        self.config = config if config is not None else build_config()
        self.kl_cfg = self.config.actor.kl_loss

    def _log_prob(self, input_ids: torch.Tensor, response_length: int) -> torch.Tensor:
        logits = self.module(input_ids=input_ids).logits[:, -response_length - 1 : -1]
        return torch.distributions.Categorical(logits=logits).log_prob(input_ids[:, -response_length:])

    def update_policy(self, data: Dict[str, torch.Tensor]) -> Dict[str, float]:
        cfg = self.config.actor
        mbs = cfg.ppo_micro_batch_size
        n = data["input_ids"].shape[0]
        response_length = data["response_mask"].shape[1]
        metrics = {"actor/pg_loss": 0.0, "actor/kl_loss": 0.0}
        for start in range(0, n, mbs):
            mb = {k: v[start : start + mbs] for k, v in data.items()}
            mask = mb["response_mask"]
            log_prob = self._log_prob(mb["input_ids"], response_length)
            ratio = torch.exp(log_prob - mb["old_log_probs"])
            clipped = torch.clamp(ratio, 1 - cfg.clip_ratio, 1 + cfg.clip_ratio)
            pg_loss = agg_loss(torch.max(-mb["advantages"] * ratio, -mb["advantages"] * clipped), mask)
            policy_loss = pg_loss
            if self.kl_cfg.enable:
                kl_fn = KL_LOSSES[self.kl_cfg.type]
                # error: KL003
                kld = kl_fn(log_prob, mb["ref_log_prob"], mb["rollout_log_probs"], self.kl_cfg.max_is_ratio)
                kl_loss = agg_loss(kld, mask)
                policy_loss = policy_loss + self.kl_cfg.coef * kl_loss
                metrics["actor/kl_loss"] += kl_loss.item()
            (policy_loss * mask.shape[0] / n).backward()
            metrics["actor/pg_loss"] += pg_loss.item()
        return metrics
