# Part of e04 (see __init__.py). Name -> KL estimator.
from typing import Callable, Dict

_KL_FNS: Dict[str, Callable] = {}


def register_kl(name: str):
    def deco(fn: Callable) -> Callable:
        if name in _KL_FNS:
            raise KeyError(f"KL estimator {name!r} registered twice")
        _KL_FNS[name] = fn
        return fn

    return deco


def get_kl_fn(name: str) -> Callable:
    try:
        return _KL_FNS[name]
    except KeyError as err:
        raise KeyError(f"unknown kl_type {name!r}; known: {sorted(_KL_FNS)}") from err


def available():
    return sorted(_KL_FNS)
