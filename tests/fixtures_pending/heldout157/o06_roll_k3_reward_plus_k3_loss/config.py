# Part of o06 (see __init__.py). Pipeline defaults, overridable from YAML.
from types import SimpleNamespace

PIPELINE_DEFAULTS = {
    "adv_estimator": "reinforce_plus_plus",
    "gamma": 1.0,
    "init_kl_coef": 0.02,
    "add_token_level_kl": True,
    "use_kl_loss": True,
    # same coefficient as the in-reward KL: the two k3 halves add up
    "kl_loss_coef": 0.02,
    # one of "k1", "k2", "k3"
    "kl_estimator": "k3",
    "pg_clip": 0.2,
    "whiten_advantages": False,
    "max_len_mask": True,
}


def make_pipeline_config(overrides=None):
    cfg = dict(PIPELINE_DEFAULTS)
    for key, value in (overrides or {}).items():
        if key not in cfg:
            raise KeyError(f"unknown pipeline option {key}")
        cfg[key] = value
    return SimpleNamespace(**cfg)
