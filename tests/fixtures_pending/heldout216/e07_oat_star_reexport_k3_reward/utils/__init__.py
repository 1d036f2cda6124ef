"""Learner utilities; ``from .utils import *`` gives the learners everything below."""

from .kl import *  # noqa: F401,F403
from .kl import __all__ as _kl_all
from .torch_functional import *  # noqa: F401,F403
from .torch_functional import __all__ as _tf_all

__all__ = [*_kl_all, *_tf_all]

ESTIMATORS = ("k1", "k2", "k3")


def check_estimator(name: str) -> str:
    if name not in ESTIMATORS:
        raise ValueError(f"kl_estimator must be one of {ESTIMATORS}, got {name!r}")
    return name


def get_helper(name: str):
    """Look up a re-exported helper by name (used by config validation)."""
    if name not in __all__:
        raise KeyError(f"{name!r} is not exported by {__name__}; choose from {sorted(__all__)}")
    return globals()[name]


def available_helpers():
    return sorted(__all__)
