"""Which tensor is the policy, the reference, the behaviour policy.

Names are the weakest evidence and are used last. Stronger evidence, applied
by the interpreter: a value computed under ``torch.no_grad()`` or
``.detach()``-ed has no gradient whatever it is called; a tensor read from a
stored rollout (``batch[...]``, ``experience.x``) has none either; a log-prob
computed by a model called ``ref_model``/``reference``/``base``/``initial``
is the reference's. This module only reads names and keys.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kllint.analysis.ir import Level, Role

# Words are the pieces of an identifier split at underscores, dots, digits
# and camelCase humps: "ref_per_token_logps" -> ref, per, token, logps.
_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])")

LOGPROB_WORDS = frozenset(
    {
        "logp",
        "logps",
        "logprob",
        "logprobs",
        "lp",
        "lps",
        "logpi",
        "logpis",
        "lprob",
        "lprobs",
        "loglik",
        "logits_logp",
        "logprobability",
    }
)
# "log" followed by one of these is a log-prob too: log_probs, log_prob, log_pi, log_p.
AFTER_LOG_WORDS = frozenset(
    {
        "prob",
        "probs",
        "p",
        "ps",
        "pi",
        "pis",
        "probability",
        "probabilities",
        "likelihood",
        "likelihoods",
    }
)
PROB_WORDS = frozenset({"prob", "probs", "pi", "probabilities"})
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
        "vllm",
        "prev",
        "previous",
        "mu",
        "inference",
        "gen",
        "generation",
    }
)
SEQUENCE_WORDS = frozenset(
    {
        "seq",
        "seqs",
        "sequence",
        "sequences",
        "sum",
        "total",
        "chosen",
        "rejected",
        "sentence",
        "traj",
        "trajectory",
    }
)
MASK_WORDS = frozenset({"mask", "masks"})
ADVANTAGE_WORDS = frozenset(
    {
        "adv",
        "advs",
        "advantage",
        "advantages",
        "reward",
        "rewards",
        "return",
        "returns",
        "score",
        "scores",
        "value",
        "values",
        "baseline",
    }
)
COEFFICIENT_WORDS = frozenset(
    {
        "beta",
        "coef",
        "coeff",
        "coefficient",
        "alpha",
        "lam",
        "lambda",
        "weight",
        "scale",
        "ctl",
        "temperature",
        "gamma",
        "eps",
        "epsilon",
    }
)
# Objects that hold stored rollout data: a tensor read from one has no gradient.
CONTAINER_WORDS = frozenset(
    {
        "batch",
        "data",
        "inputs",
        "experience",
        "exp",
        "experiences",
        "samples",
        "sample",
        "rollout",
        "rollouts",
        "buffer",
        "minibatch",
        "mb",
        "micro",
        "storage",
        "memory",
        "traj",
        "trajectory",
        "episode",
        "transition",
        "transitions",
    }
)


def words(name: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(name)]


def is_logprob_name(name: str) -> bool:
    ws = words(name)
    if any(w in LOGPROB_WORDS for w in ws):
        return True
    return any(w == "log" and nxt in AFTER_LOG_WORDS for w, nxt in zip(ws, ws[1:]))


def is_prob_name(name: str) -> bool:
    """Probabilities (``pi``, ``ref_probs``): used as ``log(pi / pi_ref)``."""
    ws = words(name)
    return "log" not in ws and any(w in PROB_WORDS for w in ws)


def has_words(name: str, vocabulary: frozenset[str]) -> bool:
    return any(w in vocabulary for w in words(name))


@dataclass(frozen=True)
class RolePatterns:
    """Extra regular expressions from ``[tool.kllint.roles]``, searched in a
    name before the built-in vocabulary."""

    policy: tuple[str, ...] = ()
    reference: tuple[str, ...] = ()
    old: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, mapping: Mapping[str, Any]) -> RolePatterns:
        """``mapping`` is the ``[tool.kllint.roles]`` table: keys ``policy``,
        ``reference``, ``old``, each a list of regular expressions matched
        (``re.search``) against names, attributes and dict keys. Raises
        ``ValueError`` with a readable message on an unknown key or a bad pattern."""
        known = {"policy", "reference", "old"}
        unknown = sorted(set(mapping) - known)
        if unknown:
            raise ValueError(
                f"unknown key(s) in [tool.kllint.roles]: {', '.join(unknown)} (expected: policy, reference, old)"
            )
        values: dict[str, tuple[str, ...]] = {}
        for key in known:
            patterns = mapping.get(key, [])
            if (
                isinstance(patterns, str)
                or not isinstance(patterns, list)
                or not all(isinstance(p, str) for p in patterns)
            ):
                raise ValueError(f"[tool.kllint.roles] {key} must be a list of regular expressions")
            for pattern in patterns:
                try:
                    re.compile(pattern)
                except re.error as exc:
                    raise ValueError(
                        f"[tool.kllint.roles] {key}: bad regular expression {pattern!r}: {exc}"
                    ) from exc
            values[key] = tuple(patterns)
        return cls(**values)

    def _configured(self, name: str) -> Role | None:
        for role, patterns in (
            (Role.REFERENCE_LOGP, self.reference),
            (Role.OLD_LOGP, self.old),
            (Role.POLICY_LOGP, self.policy),
        ):
            if any(re.search(p, name) for p in patterns):
                return role
        return None

    def logprob_role(self, name: str) -> Role | None:
        """The role of a log-prob named ``name``, or None if it is not a log-prob."""
        configured = self._configured(name)
        if configured is not None:
            return configured
        if not (is_logprob_name(name) or is_prob_name(name)):
            return None
        return self.role_from_words(name) or Role.POLICY_LOGP

    def role_from_words(self, name: str) -> Role | None:
        """Reference or behaviour evidence in a name, else None."""
        configured = self._configured(name)
        if configured is not None:
            return configured
        if has_words(name, REFERENCE_WORDS):
            return Role.REFERENCE_LOGP
        if has_words(name, OLD_WORDS):
            return Role.OLD_LOGP
        return None

    def is_reference_model(self, names: Iterable[str]) -> bool:
        return any(self.role_from_words(n) is Role.REFERENCE_LOGP for n in names)


def level_of(name: str) -> Level:
    return Level.SEQUENCE if has_words(name, SEQUENCE_WORDS) else Level.TOKEN


def weight_role(name: str) -> Role | None:
    """Non-log-prob operands: masks, advantages, coefficients."""
    if has_words(name, MASK_WORDS):
        return Role.MASK
    if has_words(name, ADVANTAGE_WORDS):
        return Role.ADVANTAGE
    if has_words(name, COEFFICIENT_WORDS) or name.isupper():
        return Role.COEFFICIENT
    return None
