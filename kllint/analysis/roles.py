"""Role evidence: which tensor is the policy, the reference, the behaviour
policy, a mask, an advantage, a coefficient; and every word list used for it.

Names are the weakest evidence and are used last. Stronger evidence, gathered
by the interpreter on an ``Unknown`` value: a value computed under
``torch.no_grad()`` or ``.detach()``-ed has no gradient whatever it is
called; a tensor read from a stored rollout (``batch[...]``, ``experience.x``)
has none either; a log-prob computed by a model called
``ref_model``/``reference``/``base``/``initial`` is the reference's.
``resolve`` weighs that evidence and turns an unknown value into an IR atom.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import libcst as cst

from kllint.analysis import ir
from kllint.analysis.ir import Level, Role
from kllint.analysis.module import ClassInfo, FunctionKey, ModuleInfo, Sketch
from kllint.analysis.policy_words import OLD_WORDS, REFERENCE_WORDS, names_a_guard
from kllint.analysis.values import (
    Choice,
    DictVal,
    Flipped,
    FuncRef,
    Grouped,
    Instance,
    Seq,
    Unknown,
    Value,
    has_distribution,
)

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
        # A dict of them by loss name (``self.loss_coefs["kl"]``).
        "coefs",
        "coeffs",
        "coefficients",
        "alpha",
        "lam",
        "lambda",
        # A Lagrange multiplier on a KL budget, kept non-negative by dual ascent.
        "multiplier",
        "weight",
        "scale",
        "ctl",
        "temperature",
        # A KL's regularisation strength in mirror-descent objectives (OPMD's
        # ``(r - tau * log_ratio) ** 2``).
        "tau",
        "gamma",
        "eps",
        "epsilon",
        # A constraint's bound (``kl_budget`` in ``relu(kl - kl_budget)``): it
        # moves the value, not the gradient.
        "budget",
        "threshold",
        "margin",
        # Counts that normalise a loss (``loss / grad_accum``, ``/ num_mini_batches``).
        "accum",
        "accumulation",
        "num",
        "count",
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
    known = _WORDS.get(name)
    if known is None:
        if len(_WORDS) > 200_000:
            _WORDS.clear()
        known = _WORDS[name] = [w.lower() for w in _WORD.findall(name)]
    return known


# Each name's words, split once: the analysis asks for the same few
# thousand names hundreds of thousands of times. (Shared: never mutated.)
_WORDS: dict[str, list[str]] = {}


# Paper notation that researchers' code keeps, whole identifiers: log q and
# p0 or pi0 for the reference (KL(p||q), the initial policy), log mu for the
# behaviour policy. (Words drop digits: ``pi0`` would read as ``pi``.)
TERSE_LOGPROBS: dict[str, Role] = {
    "lq": Role.REFERENCE_LOGP,
    "logq": Role.REFERENCE_LOGP,
    "lp0": Role.REFERENCE_LOGP,
    "logp0": Role.REFERENCE_LOGP,
    "lpi0": Role.REFERENCE_LOGP,
    "logpi0": Role.REFERENCE_LOGP,
    "lmu": Role.OLD_LOGP,
    "logmu": Role.OLD_LOGP,
}
# Not ``p``, ``q`` or ``mu`` alone: parameters, queries, Q-values and means
# are named so too.
TERSE_PROBS: dict[str, Role] = {
    "p0": Role.REFERENCE_LOGP,
    "pi0": Role.REFERENCE_LOGP,
}


def terse_role(name: str) -> Role | None:
    """``lq``, ``p0``, ``mu``: whose log-probs (or probabilities) a terse name holds."""
    return TERSE_LOGPROBS.get(name) or TERSE_PROBS.get(name)


# A reward model's (a process reward model's) own log-probs: PRIME's implicit
# reward ``beta * (prm_log_prob - prm_ref_log_prob)`` is a score, not a KL of
# the policy.
REWARD_MODEL_WORDS = frozenset({"prm", "prms", "orm", "rm"})


@lru_cache(maxsize=1 << 16)  # the same names, asked again and again
def is_logprob_name(name: str) -> bool:
    if name in TERSE_LOGPROBS:
        return True
    ws = words(name)
    if any(w in REWARD_MODEL_WORDS for w in ws):
        return False
    if any(w in LOGPROB_WORDS for w in ws):
        return True
    return any(w == "log" and nxt in AFTER_LOG_WORDS for w, nxt in zip(ws, ws[1:]))


@lru_cache(maxsize=1 << 16)
def is_prob_name(name: str) -> bool:
    """Probabilities (``pi``, ``ref_probs``): used as ``log(pi / pi_ref)``."""
    if name in TERSE_PROBS:
        return True
    ws = words(name)
    return "log" not in ws and any(w in PROB_WORDS for w in ws)


@lru_cache(maxsize=1 << 16)
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
        if not (self.reference or self.old or self.policy):
            return None
        for role, patterns in (
            (Role.REFERENCE_LOGP, self.reference),
            (Role.OLD_LOGP, self.old),
            (Role.POLICY_LOGP, self.policy),
        ):
            if any(re.search(p, name) for p in patterns):
                return role
        return None

    # Cached on the patterns, which live as long as the run.
    @lru_cache(maxsize=1 << 16)  # noqa: B019
    def logprob_role(self, name: str) -> Role | None:
        """The role of a log-prob named ``name``, or None if it is not a log-prob."""
        configured = self._configured(name)
        if configured is not None:
            return configured
        if not (is_logprob_name(name) or is_prob_name(name)):
            return None
        return self.role_from_words(name) or Role.POLICY_LOGP

    # Cached on the patterns, which live as long as the run.
    @lru_cache(maxsize=1 << 16)  # noqa: B019
    def role_from_words(self, name: str) -> Role | None:
        """Reference or behaviour evidence in a name, else None."""
        configured = self._configured(name)
        if configured is not None:
            return configured
        terse = terse_role(name)
        if terse is not None:
            return None if terse is Role.POLICY_LOGP else terse
        if has_words(name, REFERENCE_WORDS):
            return Role.REFERENCE_LOGP
        if has_words(name, OLD_WORDS) or words(name)[:3] in _STORED_SAMPLE_LOG_PROB:
            return Role.OLD_LOGP
        return None

    def is_reference_model(self, names: Iterable[str]) -> bool:
        # Every model is loaded ``from_pretrained``: that says nothing of
        # which policy it is.
        return any(
            self.role_from_words(n) is Role.REFERENCE_LOGP
            for n in names
            if n != "from_pretrained" and not _names_a_base_class(n)
        )


def _names_a_base_class(name: str) -> bool:
    """``LearnerBase(actor)``, ``BaseTrainer``: a class named by the
    convention for base classes, not a base (reference) model."""
    return name[:1].isupper() and set(words(name)) & REFERENCE_WORDS == {"base"}


# TorchRL's ``"sample_log_prob"`` key: the log-probs the collector stored
# with each sampled action, the behaviour policy's.
_STORED_SAMPLE_LOG_PROB = (["sample", "log", "prob"], ["sample", "log", "probs"])


def level_of(name: str) -> Level:
    if "topk" in name.lower().replace("_", ""):
        # ``student_topk_log_probs``: k entries of each next-token
        # distribution (a top-k support), not the sampled token's log-prob.
        return Level.DISTRIBUTION
    return Level.SEQUENCE if has_words(name, SEQUENCE_WORDS) else Level.TOKEN


# Paper notation for the other operands: A (advantages), G (returns), R (rewards),
# M or m (a mask); an upper-case name is otherwise a constant.
TERSE_WEIGHTS: dict[str, Role] = {
    "A": Role.ADVANTAGE,
    "G": Role.ADVANTAGE,
    "R": Role.ADVANTAGE,
    "M": Role.MASK,
    "m": Role.MASK,
}


def weight_role(name: str) -> Role | None:
    """Non-log-prob operands: masks, advantages, coefficients."""
    if name in TERSE_WEIGHTS:
        return TERSE_WEIGHTS[name]
    ws = words(name)
    if ws and (ws[0] in _COUNT_WORDS or "size" in ws):
        # ``num_return_sequences_in_group``, ``n_samples``, ``group_size``: a
        # count, whatever it counts.
        return Role.COEFFICIENT
    if has_words(name, MASK_WORDS):
        return Role.MASK
    if ws and ws[-1] == "value" and set(ws[:-1]) & (_CONTROLLER_WORDS - {"kl"}):
        # ``self.kl_ctl_value``, ``beta_value``: an (adaptive) KL coefficient's
        # value, not a critic's, as ``self.kl_ctl.value`` is.
        return Role.COEFFICIENT
    if has_words(name, ADVANTAGE_WORDS) or has_words(name, REWARD_MODEL_WORDS):
        return Role.ADVANTAGE
    if has_words(name, COEFFICIENT_WORDS) or names_a_guard(name) or name.isupper():
        return Role.COEFFICIENT
    if has_words(name, _MAX_WORDS) and has_words(name, _LENGTH_WORDS):
        # ``args.max_response_len``: a fixed length budget (a loss normalised
        # by it, Dr. GRPO style), a constant like any setting.
        return Role.COEFFICIENT
    return None


_MAX_WORDS = frozenset({"max"})
_COUNT_WORDS = frozenset({"n", "num"})
_LENGTH_WORDS = frozenset({"len", "length", "tokens"})


# An advantage or return estimator (``compute_gae``, ``get_returns``).
ADVANTAGE_ESTIMATOR_WORDS = frozenset(
    {"gae", "advantage", "advantages", "return", "returns", "rtg"}
)
# Log-probs per token of a sequence (evidence of a time axis).
TOKEN_WORDS = frozenset(
    {
        "token",
        "tokens",
        "completion",
        "completions",
        "response",
        "responses",
        "generation",
        "generated",
    }
)
# The current policy named against a plain rollout log-prob (``new_logprobs``).
CURRENT_WORDS = frozenset({"new", "cur", "curr", "current", "online", "updated"})
# Two fixed responses compared (DPO/IPO): not an on-policy KL.
PREFERENCE_WORDS = frozenset(
    {"chosen", "rejected", "preferred", "dispreferred", "win", "lose", "winner", "loser"}
)


# Log-probs of data the policy did not sample: demonstrations, a pretraining
# mix (InstructGPT's ``ptx_loss``), expert trajectories. An NLL term there,
# however it is written against the reference, is no KL estimate.
DEMONSTRATION_WORDS = frozenset(
    {"ptx", "demo", "demos", "demonstration", "demonstrations", "pretrain", "pretraining", "expert"}
)


def from_container(names: tuple[str, ...]) -> bool:
    """A chain read from stored rollout data (``batch["ref_logprobs"]``)."""
    return any(w in CONTAINER_WORDS for n in names for w in words(n))


def loads_data(name: str) -> bool:
    """``DataLoader``, ``train_dataloader``: a loader of data, whose rows are
    read back, not computed by the model being trained."""
    return any(w in _LOADER_WORDS for w in words(name))


_LOADER_WORDS = frozenset({"loader", "dataloader"})


def is_one_log_prob(value: Value) -> bool:
    """A value that is one policy (or behaviour) log-prob, possibly detached."""
    if not isinstance(value, ir.Node):
        return False
    atoms = {(a.role, a.name) for a in value.atoms()}
    return len(atoms) == 1 and next(iter(atoms))[0] in (Role.POLICY_LOGP, Role.OLD_LOGP)


def is_one_probability(value: Value) -> bool:
    """``exp`` of one log-prob, possibly detached: a token's probability."""
    bare = value.arg if isinstance(value, ir.Unary) and value.op == "detach" else value
    return (
        isinstance(bare, ir.Unary)
        and bare.op == "exp"
        and isinstance(bare.arg, ir.Atom)
        and bare.arg.role in (Role.POLICY_LOGP, Role.OLD_LOGP, Role.REFERENCE_LOGP)
    )


def resolve(
    unknown: Unknown,
    patterns: RolePatterns,
    target: str | None = None,
    *,
    keep_unknown: bool = False,
    no_grad: bool = False,
) -> Value:
    """Decide what an unknown value is, from the strongest evidence first.
    ``target`` is the name it is assigned to; ``no_grad`` whether it is
    computed without gradient."""
    if unknown.numpy:
        return ir.Opaque(unknown.text)
    if keep_unknown and _normaliser_of_logits(unknown):
        # ``logsumexp = torch.logsumexp(logits, dim=-1)``: log Z, whatever the
        # variable is called; ``picked - logsumexp`` is the log-prob.
        return unknown
    name = target or unknown.text
    role, name, prob = _logprob_evidence(unknown, patterns, target, name)
    if role is None:
        if keep_unknown:
            return unknown
        weight = _weight_of(unknown)
        if (
            weight is Role.ADVANTAGE
            and unknown.call
            and not (unknown.stored or unknown.detached or no_grad)
        ):
            # ``values = self.value_head(hidden)``: a prediction with its own
            # gradient (a critic), not a detached weight.
            return ir.Opaque(unknown.text)
        if weight is Role.MASK and has_words(_last_name(unknown), SAMPLE_WORDS):
            # ``sample_mask``: which samples count, one value per sequence.
            return ir.Atom(weight, unknown.text, ir.Level.SEQUENCE)
        if weight is not None:
            return ir.Atom(weight, unknown.text)
        if unknown.names[:1] == ("condition",):
            # ``(input_ids != image_token_id)`` in a mask: truth values.
            return ir.Opaque(unknown.text, gradient_free=True)
        return ir.Opaque(unknown.text)
    level = ir.Level.DISTRIBUTION if unknown.distribution else level_of(name)
    atom: ir.Node = ir.Atom(role, name, level, per_token=unknown.per_token)
    if prob:
        atom = ir.Unary("exp", atom)
    if unknown.stored or unknown.detached or no_grad:
        atom = ir.detach(atom)
    return atom


def _normaliser_of_logits(unknown: Unknown) -> bool:
    return (
        unknown.logprob_op
        and unknown.names[:1] == ("logsumexp",)
        and any(has_words(n, LOGIT_WORDS) for n in unknown.names[1:])
    )


SAMPLE_WORDS = frozenset({"sample", "samples"})
_CONTROLLER_WORDS = frozenset({"kl", "ctl", "ctrl", "controller", "coef", "beta"})


def _last_name(unknown: Unknown) -> str:
    return unknown.names[-1] if unknown.names else unknown.text


def _weight_of(unknown: Unknown) -> Role | None:
    """A mask, advantage or coefficient by the name it goes by; a plain alias
    (``m = response_mask[:, start:end]``) keeps the role of what it names.
    A call's result is named by its last name only: ``n = count_masked(...)``
    is not a mask."""
    if not unknown.names:
        return weight_role(unknown.text)
    if (
        len(unknown.names) >= 2
        and unknown.names[-1] == "value"
        and (
            has_words(unknown.names[-2], _CONTROLLER_WORDS)
            or has_words(unknown.names[-2], COEFFICIENT_WORDS)
        )
    ):
        # ``self.kl_ctl.value``: an adaptive KL coefficient; ``self.lam.value``:
        # a Lagrange multiplier's.
        return Role.COEFFICIENT
    last = weight_role(unknown.names[-1])
    if unknown.names[-1] in TERSE_WEIGHTS and not unknown.call:
        # ``G = num_samples_per_prompt``: what the notation aliases names it
        # better than the letter does (``G`` is also a return).
        last = _earlier_weight(unknown) or last
    if last is not None or unknown.call:
        return last
    return _earlier_weight(unknown)


def _earlier_weight(unknown: Unknown) -> Role | None:
    for name in reversed(unknown.names[:-1]):
        if name in _TENSOR_METADATA:
            return None  # ``T = mask.shape[1]`` is a length, not a mask
        earlier = weight_role(name)
        if earlier is not None:
            return earlier
    return None


_TENSOR_METADATA = frozenset({"shape", "size", "dtype", "device", "ndim", "is_cuda", "layout"})


def _logprob_evidence(
    unknown: Unknown, patterns: RolePatterns, target: str | None, name: str
) -> tuple[Role | None, str, bool]:
    """The log-prob role of an unknown value (None: not a log-prob), the name
    it goes by, and whether it is a probability rather than a log-prob."""
    role: Role | None = None
    prob = False
    if _loads_a_model(unknown):
        # ``pi_ref = AutoModelForCausalLM.from_pretrained(...)``: a model named
        # like its policy, whose outputs are log-probs or logits, not a tensor.
        return None, name, False
    if names_a_guard(target or _last_name(unknown)):
        # ``args.prob_eps``: the number that keeps ``log(p + eps)`` finite.
        return None, name, False
    # ``pi = Categorical(logits=...)``, ``log_softmax(pi_ref(ids).logits)``: what
    # was computed are log-probs, whatever the names say.
    computed_log_probs = unknown.logprob_op and "probs" not in unknown.names
    if target is not None and (
        is_logprob_name(target) or is_prob_name(target) or patterns.logprob_role(target)
    ):
        role = patterns.logprob_role(target)
        if terse_role(target) is not None and unknown.logprob_op:
            # ``logq = F.log_softmax(logits)``: notation names no policy;
            # what the log-probs were computed from does.
            role = (
                Role.REFERENCE_LOGP
                if unknown.reference_model
                or any(patterns.role_from_words(n) for n in unknown.names if terse_role(n) is None)
                else Role.POLICY_LOGP
            )
        prob = is_prob_name(target) and not is_logprob_name(target) and not computed_log_probs
        if (
            role is Role.POLICY_LOGP
            and patterns.role_from_words(target) is None
            and unknown.reference_model
        ):
            role = Role.REFERENCE_LOGP
        if (
            role is Role.POLICY_LOGP
            and patterns.role_from_words(target) is None
            and not unknown.call
            and any(words(n)[:3] in _STORED_SAMPLE_LOG_PROB for n in unknown.names)
        ):
            # ``sample_lp = td.get("sample_log_prob")``: the key says what it holds.
            role = Role.OLD_LOGP
        if (
            role is Role.POLICY_LOGP
            and patterns.role_from_words(target) is None
            and not unknown.call
            and any(patterns.role_from_words(n) is Role.REFERENCE_LOGP for n in unknown.names)
        ):
            # ``reset_logp = data["reset_ref_logp"]``: read from the reference's
            # entry, under a name that says only "log-probs".
            role = Role.REFERENCE_LOGP
    if role is not None:
        return role, name, prob
    source = [n for n in unknown.names if names_logits(n)]
    if target is None and unknown.logprob_op and unknown.distribution and source:
        # ``ref_logits.log_softmax(-1)`` written inline, never assigned: the
        # log-probs (``.softmax``: the probabilities) of the logits it names.
        named = next(
            (r for r in map(patterns.role_from_words, reversed(source)) if r is not None), None
        )
        role = Role.REFERENCE_LOGP if unknown.reference_model else named or Role.POLICY_LOGP
        return role, source[-1], "probs" in unknown.names
    for hint in reversed(unknown.names):
        hint_role = patterns.logprob_role(hint)
        if hint_role is not None:
            if hint_role is Role.POLICY_LOGP and unknown.reference_model:
                hint_role = Role.REFERENCE_LOGP
            prob = is_prob_name(hint) and not is_logprob_name(hint) and not computed_log_probs
            return hint_role, (hint if target is None else target), prob
    if unknown.logprob_op and target is not None:
        role = (
            Role.REFERENCE_LOGP
            if unknown.reference_model
            else patterns.role_from_words(target) or Role.POLICY_LOGP
        )
    return role, name, prob


def held_distribution_log_prob(
    unknown: Unknown, patterns: RolePatterns, *, no_grad: bool = False
) -> Value | None:
    """``old_dist.log_prob(tokens)`` (the method's name last in ``names``):
    the log-probs of a distribution held under a name that says whose
    (``old_dist``, ``ref_pi``), as that name, the one the caller chose, says;
    None when the name says nothing."""
    held = unknown.names[-2] if len(unknown.names) >= 2 else ""
    if patterns.role_from_words(held) is None:
        return None
    return resolve(replace(unknown, names=unknown.names[:-1]), patterns, held, no_grad=no_grad)


MODEL_LOADERS = frozenset({"from_pretrained", "from_config", "load_model", "build_model"})


def _loads_a_model(unknown: Unknown) -> bool:
    return unknown.call and any(n in MODEL_LOADERS for n in unknown.names)


def bare_policy_role(name: str, mentioned: Iterable[str]) -> Role | None:
    """``new``, ``old``, ``ref``: a name that says which policy and nothing
    else, in a function whose code (``mentioned``: its identifiers) works
    with log-probs: a ratio, an ``exp``, a KL, a log-prob. Such a tensor is
    that policy's log-probs; elsewhere (a hidden-state MSE, a value clip,
    a kernel check against a ``ref`` output) it is not read as one.
    (``ref_model``, ``old_values`` carry another word; logits so named are
    turned into log-probs first, which the caller checks.)"""
    role = _BARE_POLICY_NAMES.get(name)
    if role is None or not any(
        is_logprob_name(i) or any(w in _LOG_RATIO_WORDS for w in words(i)) for i in mentioned
    ):
        return None
    return role


def makes_log_probs(function: str) -> bool:
    """A function that turns logits into log-probs: ``log_softmax``,
    ``selective_log_softmax``, ``gather``, ``logsumexp``, ``get_logps``."""
    return is_logprob_name(function) or any(w in _LOGITS_TO_LOG_PROBS for w in words(function))


_LOGITS_TO_LOG_PROBS = frozenset({"softmax", "logsumexp", "gather"})
KL_WORDS = frozenset({"kl", "kld", "kls", "divergence"})
# What a KL regulariser's own term is called (``kl_term``, ``pen``).
KL_TERM_WORDS = KL_WORDS | {"penalty", "pen"}
_LOG_RATIO_WORDS = frozenset({"kl", "kld", "kls", "divergence", "exp", "expm1", "ratio", "ratios"})


_BARE_POLICY_NAMES = {
    "new": Role.POLICY_LOGP,
    "cur": Role.POLICY_LOGP,
    "curr": Role.POLICY_LOGP,
    "current": Role.POLICY_LOGP,
    "ref": Role.REFERENCE_LOGP,
    "old": Role.OLD_LOGP,
}


def name_logprob(name: str, value: Value, patterns: RolePatterns, *, no_grad: bool) -> Value:
    """A value assigned to a name like ``ref_log_prob``: what a helper did to
    compute a log-prob (a model forward, a gather) does not matter, only
    which policy it belongs to and whether it carries gradient. A value
    that already involves the reference is a log-ratio and is kept."""
    if isinstance(value, Grouped):
        # ``lp = logp.view(-1, G, T)``: renamed, still grouped by prompt.
        named = name_logprob(name, value.node, patterns, no_grad=no_grad)
        return replace(value, node=named) if isinstance(named, ir.Node) else named
    masked = _masked(value)
    if masked is not None:
        # ``logps = response_logps(model, ...)`` returning ``logps * mask``:
        # zero past each response's end, which a sum over time relies on.
        named = name_logprob(name, masked[0], patterns, no_grad=no_grad)
        return ir.binary("mul", named, masked[1]) if isinstance(named, ir.Node) else named
    renamed = reference_renamed(name, value, patterns)
    if renamed is not None:
        return renamed
    nodes = [v for _, v in value.options] if isinstance(value, Choice) else [value]
    for n in nodes:
        if not isinstance(n, ir.Node):
            continue
        atoms = {
            (a.role, a.name)
            for a in n.atoms()
            if a.role in (Role.POLICY_LOGP, Role.OLD_LOGP, Role.REFERENCE_LOGP)
        }
        if len(atoms) >= 2 or n.has_role(Role.REFERENCE_LOGP) or has_distribution(n):
            return value  # a log-ratio (``logprobs_diff = new - old``), not a log-prob
    logprob_nodes = [
        n
        for n in nodes
        if isinstance(n, ir.Node) and any(n.has_role(r) for r in (Role.POLICY_LOGP, Role.OLD_LOGP))
    ]
    if any(isinstance(part, ir.CumSum) for n in logprob_nodes for part in n.walk()):
        # ``cum_logps = logps.cumsum(-1)``: the log-prob of each prefix, which
        # a DiCE box ``exp(cum - sg(cum))`` credits with every earlier token.
        # A per-token atom by that name would drop the running sum.
        return value
    detached = bool(logprob_nodes) and not any(ir.depends_on_policy(n) for n in logprob_nodes)
    # What was computed keeps its evidence of a time axis under its new name
    # (``lp`` for each row of a helper's per-token ``logits[0, a:b]`` log-probs).
    rows = value.items if isinstance(value, Seq) else []  # ``[logprobs(p, r) for ...]``
    per_token = any(a.per_token for n in logprob_nodes for a in n.atoms()) or any(
        (isinstance(row, Unknown) and row.per_token)
        or (isinstance(row, ir.Node) and any(a.per_token for a in row.atoms()))
        for row in rows
    )
    # ``policy_logps = sequence_logps(model, ...)`` returning
    # ``(token_logps * mask).sum(-1)``: log pi(y) of each sequence, whatever
    # its name says (a per-token atom would drop the sum over time, and with
    # it the sequence-level gradient the estimate has).
    sequence = bool(logprob_nodes) and all(_sums_over_time(n) for n in logprob_nodes)
    level = Level.SEQUENCE if sequence else level_of(name)
    per_token = per_token and not sequence
    if (
        not detached
        and not no_grad
        and patterns._configured(name) is None
        and (patterns.logprob_role(name) is Role.OLD_LOGP or terse_role(name) is not None)
        and any(n.has_role(Role.POLICY_LOGP) for n in logprob_nodes)
    ):
        # ``sampled_logp = s_logp.gather(...)`` from the policy's own logits,
        # with its gradient: the policy's log-prob, whatever its name says (a
        # behaviour policy's log-prob carries no gradient; ``logq`` is only
        # notation). A role the user configured for the name still wins.
        return ir.Atom(Role.POLICY_LOGP, name, level, per_token=per_token)
    if patterns.logprob_role(name) is None and logprob_nodes:
        # ``ref = reference_logprobs(...)``: a log-prob named by its role alone.
        role = patterns.role_from_words(name) or Role.POLICY_LOGP
        atom: ir.Node = ir.Atom(role, name, level, per_token=per_token)
        return ir.detach(atom) if detached or no_grad else atom
    resolved = resolve(
        Unknown(name, (name,), call=True, detached=detached, per_token=per_token),
        patterns,
        no_grad=no_grad,
    )
    if sequence and isinstance(resolved, ir.Node):
        return ir.substitute(
            resolved, {id(a): replace(a, level=Level.SEQUENCE) for a in resolved.atoms()}
        )
    return resolved


def _masked(value: Value) -> tuple[ir.Node, ir.Node] | None:
    """``(logp, mask)`` of a log-prob multiplied by a token mask."""
    if not (isinstance(value, ir.Binary) and value.op == "mul"):
        return None
    for logp, mask in ((value.left, value.right), (value.right, value.left)):
        if (
            isinstance(mask, ir.Atom)
            and mask.role is Role.MASK
            and not logp.has_role(Role.MASK)
            and any(logp.has_role(r) for r in (Role.POLICY_LOGP, Role.OLD_LOGP))
            and not logp.has_role(Role.REFERENCE_LOGP)
        ):
            return logp, mask
    return None


def _sums_over_time(node: ir.Node) -> bool:
    bare = node.arg if isinstance(node, ir.Unary) and node.op == "detach" else node
    return isinstance(bare, ir.Reduce) and bare.kind == "sum" and bare.axis is ir.Axis.TIME


# Context managers under which the policy's own model is the reference: a
# LoRA policy with its adapter switched off is the base model (PEFT's
# ``disable_adapter``, TRL's ``null_ref_context``).
REFERENCE_CONTEXTS = frozenset({"disable_adapter", "disable_adapters", "null_ref_context"})


def gives_the_reference(context: object) -> bool:
    """``with model.disable_adapter():``: what the block computes with the
    model is the reference's."""
    return (
        isinstance(context, cst.Call)
        and isinstance(context.func, (cst.Attribute, cst.Name))
        and (context.func.attr if isinstance(context.func, cst.Attribute) else context.func).value
        in REFERENCE_CONTEXTS
    )


_LOGPROB_ROLES = (Role.POLICY_LOGP, Role.OLD_LOGP, Role.REFERENCE_LOGP)


def as_reference(name: str, value: Value) -> Value:
    """A log-prob computed under ``disable_adapter()`` (``lq = take(policy(ids))``):
    the reference's, under the name it is assigned to, also when that name
    says otherwise (``inputs["prev_logps"]``: the code is the evidence)."""
    if isinstance(value, Choice):
        return Choice([(label, as_reference(name, option)) for label, option in value.options])
    if not isinstance(value, ir.Node):
        return value
    logprobs = [a for a in value.atoms() if a.role in _LOGPROB_ROLES]
    if len({id(a) for a in logprobs}) != 1 or logprobs[0].role is Role.REFERENCE_LOGP:
        return value
    atom = logprobs[0]
    return ir.substitute(value, {id(atom): replace(atom, role=Role.REFERENCE_LOGP, name=name)})


def reference_renamed(name: str, value: Value, patterns: RolePatterns) -> ir.Node | None:
    """``ref_logp, _ = self.logprobs(self.ref_policy, batch)``: the reference
    log-prob a helper returned (masked or not: ``lp * response_mask``) goes by
    the caller's name (``ref_logp``, not the helper's ``token_logps``), the
    name a message and a fix must use. So does a reference's probability
    (``ref_tok = token_probs(ref_model, ...)``), named by its policy alone."""
    if not isinstance(value, ir.Node):
        return None
    logprobs = {
        id(a): a
        for a in value.atoms()
        if a.role in (Role.POLICY_LOGP, Role.OLD_LOGP, Role.REFERENCE_LOGP)
    }
    if len(logprobs) != 1:
        return None
    (atom,) = logprobs.values()
    if atom.role is not Role.REFERENCE_LOGP:
        return None
    probability = any(
        isinstance(n, ir.Unary) and n.op == "exp" and n.arg is atom for n in value.walk()
    )
    named = patterns.logprob_role(name) or (patterns.role_from_words(name) if probability else None)
    if named is not Role.REFERENCE_LOGP:
        return None
    return ir.substitute(value, {id(atom): replace(atom, name=name)})


# ----------------------------------------------------------------- relevance

# Scores before a softmax: scaled by a temperature, still that model's.
LOGIT_WORDS = frozenset({"logits", "logit"})


# A reference that generated the data the policy learns from (distillation
# on a teacher's samples), not a prior the policy's own samples are held to.
TEACHER_WORDS = frozenset({"teacher", "teachers"})


# Models other than the frozen reference that a policy may be regularised
# towards, each a divergence of its own: a KL to the reference and a KL to
# an anchor checkpoint are two regularisers, not two halves of one.
_OTHER_ANCHORS = frozenset({"anchor", "teacher", "prior", "ema"})


def reference_kind(name: str) -> frozenset[str]:
    """Which model a reference log-prob is of, by its words: ``{"anchor"}``
    for ``anchor_log_probs``, ``{"reference"}`` for ``ref_logps`` or
    ``base_action_log_probs``; empty when the name does not say."""
    found = set(words(name)) & REFERENCE_WORDS
    kinds = found & _OTHER_ANCHORS
    if found - _OTHER_ANCHORS:
        kinds.add("reference")
    return frozenset(kinds)


def names_a_teacher(name: str) -> bool:
    """``teacher_logps``, ``t_teacher_lp``: the reference is a teacher."""
    return has_words(name, TEACHER_WORDS)


# A discount of returns (``gamma``, GAE's ``lam``): a reward-to-go is one
# only undiscounted, so the harness holds a configured one at its default.
DISCOUNT_WORDS = frozenset({"gamma", "lam", "lambd", "lmbda", "lambda", "discount"})


# A critic's output: its logits are a distribution over value bins (a
# categorical value head), not a policy's next-token distribution.
CRITIC_WORDS = frozenset({"value", "values", "critic", "vf"})


def names_a_critic(name: str) -> bool:
    """``value_logits``, ``critic_logits``: a critic's, not a policy's."""
    return has_words(name, CRITIC_WORDS)


def names_logits(name: str) -> bool:
    """``pi_logits``, ``self.model(ids).logits``: a model's logits, from
    which log-probs are yet to be formed."""
    return bool(LOGIT_WORDS & set(words(name.rsplit(".", 1)[-1])))


# Words of an identifier that a function able to produce or judge a KL term
# mentions somewhere: log-probs and the ops that compute them, a reference
# or behaviour policy, KL itself, a loss or a backward pass (a sink). A
# function that mentions none of them, and is given no log-prob, cannot
# return a KL term (its callees that do are named in it; see
# ``ModuleInfo.may_compute_kl``), so it is not followed.
RELEVANCE_WORDS = LOGPROB_WORDS | {
    # Not "base", "init": every ``__init__`` and ``base_model`` says them,
    # and a log-prob of such a model is named with a log-prob word too.
    "ref",
    "refs",
    "reference",
    "teacher",
    "kl",
    "kld",
    "kls",
    "divergence",
    "exp",
    "softmax",
    "logsumexp",
    "logits",
    "logit",
    "old",
    "behav",
    "behaviour",
    "behavior",
    "loss",
    "losses",
    "backward",
    "objective",
}
_AFTER_LOG = AFTER_LOG_WORDS | {"softmax", "sigmoid", "sum", "exp"}
_RELEVANT_IDENTIFIERS: dict[str, bool] = {}


def relevant_identifier(identifier: str) -> bool:
    """``ref_logps``, ``log_softmax``, ``kl_coef``, ``loss``: see ``RELEVANCE_WORDS``."""
    known = _RELEVANT_IDENTIFIERS.get(identifier)
    if known is None:
        ws = words(identifier)
        # ``log`` on its own (``torch.log``, ``ratio.log()``) or before a
        # probability (``log_softmax``, ``log_probs``); not ``log_metrics``.
        known = _RELEVANT_IDENTIFIERS[identifier] = (
            ws == ["log"]
            or any(w in RELEVANCE_WORDS for w in ws)
            or any(w == "log" and nxt in _AFTER_LOG for w, nxt in zip(ws, ws[1:]))
        )
    return known


def may_compute_kl(
    module: ModuleInfo,
    fn: str,
    cls: ClassInfo | None,
    patterns: RolePatterns,
) -> bool:
    """Whether ``fn`` mentions what a KL term is made of (see
    ``roles.RELEVANCE_WORDS``), or calls a function of its module that does.
    True when kllint cannot tell (names the source does not show, roles
    configured by the user)."""
    if patterns.policy or patterns.reference or patterns.old:
        return True
    return sketch_may_compute_kl(module.sketch, cls.name if cls else None, fn)


def sketch_may_compute_kl(sketch: Sketch, cls: str | None, name: str) -> bool:
    return _mentions(sketch, (cls, name), set(), sketch.relevance, relevant_identifier)


def methods_that_may_compute_kl(module: ModuleInfo, cls: ClassInfo) -> set[str]:
    """The methods of ``cls`` (not its constructor) that can compute a KL term."""
    return {
        name
        for name in cls.methods
        if name != "__init__" and sketch_may_compute_kl(module.sketch, cls.name, name)
    }


# What makes a value the reference's: a name with a reference word (a
# log-prob, a model: ``RolePatterns.role_from_words``, ``is_reference_model``),
# a bare ``ref``, a context that switches an adapter off; or a KL named as one.
REFERENCE_EVIDENCE = REFERENCE_WORDS | KL_WORDS
# Identifiers with such a word that never name a reference: a constructor, a
# model loader (``is_reference_model`` ignores it), weight initialisation.
_NOT_A_REFERENCE = frozenset(
    {"__init__", "from_pretrained", "post_init", "init_weights", "_init_weights"}
)


def reference_evidence(identifier: str) -> bool:
    """``ref_logps``, ``self.teacher``, ``disable_adapter``, ``kl_coef``."""
    return identifier in REFERENCE_CONTEXTS or (
        identifier not in _NOT_A_REFERENCE
        and any(w in REFERENCE_EVIDENCE for w in words(identifier))
    )


def sketch_mentions(
    sketch: Sketch,
    cls: str | None,
    name: str,
    cache: dict[FunctionKey, bool],
    evidence: Callable[[str], bool],
) -> bool:
    """Whether a function, or one of its module it calls, mentions an
    identifier that is ``evidence`` (``cache``: the answers so far, per
    function of the sketch)."""
    return _mentions(sketch, (cls, name), set(), cache, evidence)


def _mentions(
    sketch: Sketch,
    key: FunctionKey,
    visiting: set[FunctionKey],
    cache: dict[FunctionKey, bool],
    evidence: Callable[[str], bool],
) -> bool:
    """Whether the function ``key``, or one of its module it calls, mentions
    an identifier that is ``evidence``; True for a function the sketch does
    not know."""
    known = cache.get(key)
    if known is not None:
        return known
    names = sketch.functions.get(key)
    if names is None or any(evidence(i) for i in names.identifiers):
        cache[key] = True
        return True
    visiting.add(key)
    found = False
    cls = key[0]
    for called in names.called:
        callee = (cls, called) if (cls, called) in sketch.functions else (None, called)
        if callee in sketch.functions and callee not in visiting:
            if _mentions(sketch, callee, visiting, cache, evidence):
                found = True
                break
    visiting.discard(key)
    if found or not visiting:
        # A verdict reached inside a cycle is not final until the cycle's entry decides.
        cache[key] = found
    return found


def may_carry_kl(value: Value) -> bool:
    """A value a KL term could be built from or hidden in."""
    if isinstance(value, ir.Node):
        return not isinstance(value, ir.Opaque) and any(
            a.role in (Role.POLICY_LOGP, Role.REFERENCE_LOGP, Role.OLD_LOGP) for a in value.atoms()
        )
    if isinstance(value, Choice):
        return any(may_carry_kl(v) for _, v in value.options)
    if isinstance(value, Seq):
        return any(may_carry_kl(v) for v in value.items)
    if isinstance(value, DictVal):
        return any(may_carry_kl(v) for v in value.items.values())
    if isinstance(value, (Flipped, Grouped)):
        return may_carry_kl(value.node)
    if isinstance(value, (FuncRef, Instance)):
        return True
    if isinstance(value, Unknown):
        # ``sample.rollout_log_probs``: log-probs read off an object, which a
        # helper may turn into a tensor (with or without a graph).
        # ``out.action_log_probs``: an attribute of a model's output is
        # named as a variable is (a call's own name is the function's).
        named = not value.call or not value.text.endswith(")")
        return bool(
            value.logprob_op
            or value.reference_model
            or (value.names and named and is_logprob_name(value.names[-1]))
        )
    return False
