"""Nested defaults in the style of a hydra ``ppo_trainer.yaml``."""
import copy
from types import SimpleNamespace
from typing import Any, Dict, Optional

import torch

try:  # optional: the trainer runs without omegaconf installed
    from omegaconf import OmegaConf
except ImportError:  # pragma: no cover
    OmegaConf = None

PPO_DEFAULTS: Dict[str, Any] = {
    "algorithm": {
        "gamma": 1.0,
        "lam": 1.0,
        "adv_estimator": "gae",
        "use_kl_in_reward": True,
        "kl_penalty": "low_var_kl",
        "kl_ctrl": {"type": "fixed", "kl_coef": 0.05},
    },
    "actor": {
        "clip_ratio": 0.2,
        "loss_agg_mode": "token-mean",
        "ppo_micro_batch_size": 8,
    },
    "dtype": "float32",
}


def _namespace(d: Dict[str, Any]) -> SimpleNamespace:
    return SimpleNamespace(**{k: _namespace(v) if isinstance(v, dict) else v for k, v in d.items()})


def _merge(base: Dict[str, Any], over: Dict[str, Any]) -> Dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_config(overrides: Optional[Dict[str, Any]] = None):
    if OmegaConf is not None:
        return OmegaConf.merge(OmegaConf.create(PPO_DEFAULTS), OmegaConf.create(overrides or {}))
    return _namespace(_merge(PPO_DEFAULTS, overrides or {}))


def torch_dtype(cfg) -> torch.dtype:
    return getattr(torch, cfg.dtype)
