"""Defaults as they would be read from ``ppo_trainer.yaml``."""

import copy

ACTOR_ROLLOUT_REF_DEFAULTS = {
    "actor_rollout_ref": {
        "hybrid_engine": True,
        "actor": {
            "strategy": "fsdp",
            "ppo_mini_batch_size": 256,
            "ppo_micro_batch_size_per_gpu": 8,
            "ppo_epochs": 1,
            "clip_ratio": 0.2,
            "grad_clip": 1.0,
            "loss_agg_mode": "seq-mean-token-mean",
            "entropy_coeff": 0.0,
            "use_kl_loss": True,
            "kl_loss_coef": 0.001,
            "kl_loss_type": "low_var_kl",
        },
        "ref": {"log_prob_micro_batch_size_per_gpu": 16},
        "rollout": {"name": "vllm", "temperature": 1.0, "n": 8},
    },
    "algorithm": {
        "adv_estimator": "grpo",
        "use_kl_in_reward": False,
        "kl_penalty": "kl",
        "kl_ctrl": {"type": "fixed", "kl_coef": 0.001},
    },
}


def actor_config(overrides=None):
    cfg = copy.deepcopy(ACTOR_ROLLOUT_REF_DEFAULTS["actor_rollout_ref"]["actor"])
    cfg.update(overrides or {})
    return cfg
