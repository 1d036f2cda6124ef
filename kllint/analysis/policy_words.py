"""Words that name whose probabilities a value holds: the reference policy's
(``ref_logps``, ``teacher_logits``) or the behaviour policy's (``old_logprobs``,
``vllm_logprobs``), and the words of a numerical guard (``prob_eps``). Apart
from ``roles`` so that the file prefilter, which runs before anything imports
LibCST, and the gradient classifier read the same words."""

from __future__ import annotations

import re
from functools import lru_cache

REFERENCE_WORDS = frozenset(
    {
        "ref",
        "refs",
        "reference",
        "base",
        "init",
        "initial",
        "sft",
        "teacher",
        "prior",
        "anchor",
        "ema",
        "frozen",
        "pretrained",
    }
)
OLD_WORDS = frozenset(
    {
        "old",
        "behav",
        "behaviour",
        "behavior",
        "rollout",
        "sampling",
        "sampled",
        "sampler",
        "vllm",
        "prev",
        "previous",
        "mu",
        "inference",
        "gen",
        "generation",
        # AReaL's decoupled PPO: the proximal policy, recomputed without
        # gradient before the update, between the behaviour policy and the learner.
        "prox",
        "proximal",
    }
)

# A setting that only keeps a logarithm or a division finite: ``log(p + eps)``
# is the log-prob, whatever number the setting holds.
GUARD_WORDS = frozenset({"eps", "epsilon", "tiny"})
# ``clip_eps``, ``epsilon_low``: PPO's clip range, an epsilon of another kind.
_NOT_GUARD_WORDS = frozenset({"clip", "clipping", "range", "ratio", "low", "high", "greedy"})
GUARD_VALUE = 1e-8

_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])")


_SETTING = re.compile(r"[A-Za-z_][\w.]*(\[[\"'][\w.]+[\"']\])?")


@lru_cache(maxsize=4096)
def names_a_guard(name: str) -> bool:
    """``eps``, ``args.prob_eps``, ``cfg["log_epsilon"]``: a setting, not an
    expression that merely mentions one (``rsqrt(var + eps)``)."""
    if not _SETTING.fullmatch(name):
        return False
    words = {w.lower() for w in _WORD.findall(re.split(r"[.\[]", name)[-1])}
    return bool(words & GUARD_WORDS) and not words & _NOT_GUARD_WORDS
