"""verl-style FSDP actor with ``use_kl_loss`` and the default config it ships."""

from .config import ACTOR_ROLLOUT_REF_DEFAULTS, actor_config
from .dp_actor import DataParallelPPOActor

__all__ = ["ACTOR_ROLLOUT_REF_DEFAULTS", "DataParallelPPOActor", "actor_config"]
