"""Words that name whose probabilities a value holds: the reference policy's
(``ref_logps``, ``teacher_logits``) or the behaviour policy's (``old_logprobs``,
``vllm_logprobs``). Apart from ``roles`` so that the file prefilter, which runs
before anything imports LibCST, reads the same words."""

from __future__ import annotations

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
