"""Tabular policies whose expectations can be computed exactly.

Every instance is small enough to enumerate: a bandit with K = 100 actions,
every sequence of a vocabulary of 4 over 4 steps (256 of them), and the same
with an end-of-sequence token and variable lengths (121 sequences). A policy
is a table of logits, one row per prefix it conditions on, so an expectation
``E_pi[f(y)] = sum_y pi(y) f(y)`` is a finite sum and its gradient is exact to
float64 rounding.

Each shape comes in the regimes training goes through (see
:mod:`kllint.harness.regimes`): policy and reference logits drawn
independently from N(0, 1), about 1 nat of KL per token (far from the
reference, where clamps bite and the two divergences differ by tens of per
cent); the reference a small perturbation of the policy, about 0.05 nat per
token (near it, where training runs spend most of their steps); and samples
drawn from a behaviour policy a few updates behind the policy (off-policy,
for importance-weighted losses). Padded positions carry the log-prob the
model gives a fixed token there, not 0, so a loss that forgets the mask
shows it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache

import torch

from kllint.harness.regimes import BANDIT as BANDIT
from kllint.harness.regimes import OFF_POLICY as OFF_POLICY
from kllint.harness.regimes import REGIMES
from kllint.harness.regimes import SEQUENCES as SEQUENCES
from kllint.harness.regimes import SEQUENCES_NEAR as SEQUENCES_NEAR
from kllint.harness.regimes import VARIABLE_LENGTH as VARIABLE_LENGTH
from kllint.harness.regimes import VARIABLE_LENGTH_NEAR as VARIABLE_LENGTH_NEAR
from kllint.harness.verdict import KL, PARTIAL_KL, PARTIAL_REVERSE_KL, REVERSE_KL

DTYPE = torch.float64

INSTANCES = REGIMES

BANDIT_ACTIONS = 100
VOCAB = 4
HORIZON = 4
EOS = 0  # the end-of-sequence token of the variable-length instance
PAD = 1  # the token whose log-prob a padded position carries
# Reference = policy + N(0, NEAR_SCALE^2) per logit: 0.05 nat of KL per token
# on average (0.028 at 0.3, 0.087 at 0.5), the range of a KL-regularised run.
NEAR_SCALE = 0.4
# The behaviour policy of the off-policy instance: the policy minus a few
# updates' worth of drift (0.02 nat per token between them).
DRIFT_SCALE = 0.25


@contextmanager
def single_threaded() -> Iterator[None]:
    """Run torch on one thread, then restore. The tensors here are tiny (a few
    hundred entries): a thread pool costs ~30x the arithmetic (log_softmax of
    [40, 4]: 100 us on 2 threads of a loaded machine, 3 us on one)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@dataclass(frozen=True)
class Rows:
    """Sequences to evaluate a term on, one row each, padded to the horizon.

    ``prefix_index[n, t]`` is the row of the logit table token ``t`` is drawn
    from (the index of the prefix ``y_<t``), ``token[n, t]`` the token,
    ``mask[n, t]`` 1 on real tokens (the end-of-sequence token included) and 0
    on padding. A padded position reads the last real position's row and
    the token ``PAD``: its log-prob is not 0 and has a gradient, as a model's
    output there does. ``weight[n]`` is what the row counts for in an
    expectation: ``pi(y)`` detached for an enumeration, ``1/n`` for samples.
    """

    prefix_index: torch.Tensor  # [N, T] long
    token: torch.Tensor  # [N, T] long
    mask: torch.Tensor  # [N, T] float64
    weight: torch.Tensor  # [N] float64, no gradient


@dataclass(frozen=True)
class Instance:
    """A tabular policy and its reference, with every sequence enumerated."""

    name: str
    description: str
    seed: int
    vocab: int
    horizon: int
    eos: int | None
    prefixes: tuple[tuple[int, ...], ...]  # row p of the tables conditions on prefixes[p]
    sequences: tuple[tuple[int, ...], ...]  # every sequence with non-zero probability
    policy_logits: torch.Tensor  # [P, V], the point theta at which gradients are taken
    reference_logits: torch.Tensor  # [P, V]
    # The policy that sampled the rollouts, when it is not the policy itself.
    behaviour_logits: torch.Tensor | None = None

    @property
    def has_prefixes(self) -> bool:
        """False for the bandit: with one token the token-level partial
        gradient is the full gradient, and only two targets are distinct."""
        return self.horizon > 1

    def rows(self, sequences: Sequence[tuple[int, ...]] | None = None) -> Rows:
        """Rows for ``sequences`` (all of them by default), weights left at 1."""
        chosen = self.sequences if sequences is None else sequences
        row_of = {prefix: p for p, prefix in enumerate(self.prefixes)}
        n, horizon = len(chosen), self.horizon
        prefix_index = torch.zeros(n, horizon, dtype=torch.long)
        token = torch.zeros(n, horizon, dtype=torch.long)
        mask = torch.zeros(n, horizon, dtype=DTYPE)
        for i, y in enumerate(chosen):
            for t, y_t in enumerate(y):
                prefix_index[i, t] = row_of[y[:t]]
                token[i, t] = y_t
                mask[i, t] = 1.0
            for t in range(len(y), horizon):
                prefix_index[i, t] = row_of[y[: max(len(y) - 1, 0)]]
                token[i, t] = PAD
        return Rows(prefix_index, token, mask, torch.ones(n, dtype=DTYPE))


def token_logp(logits: torch.Tensor, rows: Rows, *, padded: bool = False) -> torch.Tensor:
    """``log pi(y_t | y_<t)`` per token, ``[N, T]``: 0 on padding, or with
    ``padded`` what the model outputs there (what training code receives)."""
    table = torch.log_softmax(logits, dim=-1)
    values = table[rows.prefix_index, rows.token]
    return values if padded else values * rows.mask


def enumerated(
    instance: Instance, policy_logits: torch.Tensor, sampler: torch.Tensor | None = None
) -> Rows:
    """Every sequence, weighted by its probability under the policy that
    samples it (``sampler``, the policy by default), detached:
    ``sum_n weight[n] * f(y_n)`` is ``E_{y ~ pi}[f(y)]`` exactly, and its
    autograd gradient is ``E[grad f]`` with no score term for the sampling."""
    rows = all_sequences(instance)
    with torch.no_grad():
        logits = policy_logits if sampler is None else sampler
        weight = token_logp(logits, rows).sum(dim=1).exp()
    return Rows(rows.prefix_index, rows.token, rows.mask, weight)


def sample(
    instance: Instance, policy_logits: torch.Tensor, n: int, generator: torch.Generator
) -> Rows:
    """``n`` sequences drawn token by token from the policy, weight ``1/n``:
    the Monte-Carlo counterpart of :func:`enumerated` (a separate code path,
    so that a test can check one against the other)."""
    probs = torch.softmax(policy_logits.detach(), dim=-1)
    row_of = {prefix: p for p, prefix in enumerate(instance.prefixes)}
    drawn: list[tuple[int, ...]] = []
    for _ in range(n):
        y: tuple[int, ...] = ()
        for _t in range(instance.horizon):
            y_t = int(torch.multinomial(probs[row_of[y]], 1, generator=generator))
            y = (*y, y_t)
            if y_t == instance.eos:
                break
        drawn.append(y)
    rows = instance.rows(drawn)
    return Rows(rows.prefix_index, rows.token, rows.mask, torch.full((n,), 1.0 / n, dtype=DTYPE))


@dataclass(frozen=True)
class Targets:
    """Exact gradients (flattened over the policy logits) and values."""

    gradients: dict[str, torch.Tensor]  # target name -> [P * V]
    kl: float  # KL(pi||pi_ref) of the sequence distribution, nats
    reverse_kl: float  # KL(pi_ref||pi)
    expected_length: float


def targets(instance: Instance, policy_logits: torch.Tensor) -> Targets:
    """The exact gradients a KL surrogate is judged against, at ``policy_logits``.

    Full gradients come from autograd on the enumerated divergences
    ``KL(pi||pi_ref) = sum_y pi(y) log(pi(y) / pi_ref(y))`` and
    ``KL(pi_ref||pi) = sum_y pi_ref(y) log(pi_ref(y) / pi(y))``. The
    token-level partial gradients keep, for each prefix ``h``, only the
    gradient of that position's own divergence, the prefix distribution held
    fixed: ``sum_h sg(P_pi(h)) grad KL(pi(.|h) || pi_ref(.|h))``; a per-token
    loss (k2, per-token score function) summed over tokens has exactly this
    expectation.
    """
    theta = policy_logits.detach().clone().requires_grad_(True)
    rows = all_sequences(instance)
    policy_logp = token_logp(theta, rows).sum(dim=1)
    reference_logp = token_logp(instance.reference_logits, rows).sum(dim=1)
    p, q = policy_logp.exp(), reference_logp.exp()
    kl = (p * (policy_logp - reference_logp)).sum()
    reverse_kl = (q * (reference_logp - policy_logp)).sum()
    objectives = {KL: kl, REVERSE_KL: reverse_kl}
    if instance.has_prefixes:
        # P_pi(h): the product of the policy's probabilities along the prefix.
        path = prefix_paths(instance)
        reach = token_logp(theta, path).sum(dim=1).exp().detach()
        log_pi = torch.log_softmax(theta, dim=-1)
        log_ref = torch.log_softmax(instance.reference_logits, dim=-1)
        kl_h = (log_pi.exp() * (log_pi - log_ref)).sum(dim=-1)
        reverse_kl_h = (log_ref.exp() * (log_ref - log_pi)).sum(dim=-1)
        objectives[PARTIAL_KL] = (reach * kl_h).sum()
        objectives[PARTIAL_REVERSE_KL] = (reach * reverse_kl_h).sum()
    gradients = {}
    for name, objective in objectives.items():
        (grad,) = torch.autograd.grad(objective, theta, retain_graph=True)
        gradients[name] = grad.reshape(-1)
    with torch.no_grad():
        expected_length = float((p * rows.mask.sum(dim=1)).sum())
    return Targets(gradients, float(kl.detach()), float(reverse_kl.detach()), expected_length)


@cache
def instance(name: str, seed: int) -> Instance:
    """The instance ``name`` (one of :data:`INSTANCES`) with logits drawn by
    ``seed``. Cached: instances are immutable."""
    near = name in (SEQUENCES_NEAR, VARIABLE_LENGTH_NEAR, OFF_POLICY)
    where = "near the reference (~0.05 nat per token)" if near else "~1 nat per token"
    if name == BANDIT:
        vocab, horizon, eos = BANDIT_ACTIONS, 1, None
        description = f"one action: a bandit with K = {vocab} actions, {where}"
    elif name in (SEQUENCES, SEQUENCES_NEAR):
        vocab, horizon, eos = VOCAB, HORIZON, None
        description = (
            f"fixed length: vocabulary {vocab}, length {horizon}, all {vocab**horizon} "
            f"sequences enumerated, {where}"
        )
    elif name in (VARIABLE_LENGTH, VARIABLE_LENGTH_NEAR, OFF_POLICY):
        vocab, horizon, eos = VOCAB, HORIZON, EOS
        description = (
            f"variable length: vocabulary {vocab} with an end-of-sequence token, "
            f"lengths 1 to {horizon}, padding with non-zero log-probs, {where}"
        )
        if name == OFF_POLICY:
            description += ", sampled from a behaviour policy a few updates behind"
    else:
        raise ValueError(f"unknown instance {name!r}; expected one of {', '.join(INSTANCES)}")
    prefixes, sequences = _tree(vocab, horizon, eos)
    generator = torch.Generator().manual_seed(seed)
    shape = (len(prefixes), vocab)
    policy_logits = torch.randn(shape, generator=generator, dtype=DTYPE)
    reference_logits = torch.randn(shape, generator=generator, dtype=DTYPE)
    behaviour_logits = None
    if near:
        reference_logits = policy_logits + NEAR_SCALE * reference_logits
    if name == OFF_POLICY:
        drift = torch.randn(shape, generator=generator, dtype=DTYPE)
        behaviour_logits = policy_logits - DRIFT_SCALE * drift
    return Instance(
        name,
        description,
        seed,
        vocab,
        horizon,
        eos,
        prefixes,
        sequences,
        policy_logits,
        reference_logits,
        behaviour_logits,
    )


@cache
def cached_rows(name: str, seed: int) -> Rows:
    """Every sequence of instance ``name`` weighted by the policy that samples
    it, at the instance's own logits (what a confirmation evaluates on)."""
    inst = instance(name, seed)
    return enumerated(inst, inst.policy_logits, inst.behaviour_logits)


@cache
def cached_targets(name: str, seed: int) -> Targets:
    inst = instance(name, seed)
    return targets(inst, inst.policy_logits)


def _tree(
    vocab: int, horizon: int, eos: int | None
) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]:
    """Prefixes at which the policy chooses a token, and complete sequences.
    A sequence ends at ``eos`` or at the horizon."""
    prefixes: list[tuple[int, ...]] = []
    sequences: list[tuple[int, ...]] = []
    frontier: list[tuple[int, ...]] = [()]
    while frontier:
        prefixes.extend(frontier)
        grown = []
        for prefix in frontier:
            for y_t in range(vocab):
                y = (*prefix, y_t)
                if y_t == eos or len(y) == horizon:
                    sequences.append(y)
                else:
                    grown.append(y)
        frontier = grown
    return tuple(prefixes), tuple(sequences)


def all_sequences(instance: Instance) -> Rows:
    """Every sequence of the instance as rows, weights 1 (cached per shape)."""
    return _shape_rows(instance.vocab, instance.horizon, instance.eos, "sequences")


def prefix_paths(instance: Instance) -> Rows:
    """Each prefix as a (partial) row, so that ``token_logp(...).sum(1)`` is
    ``log P_pi(h)``; the empty prefix gets an all-padding row (probability 1)."""
    return _shape_rows(instance.vocab, instance.horizon, instance.eos, "prefixes")


@cache
def _shape_rows(vocab: int, horizon: int, eos: int | None, which: str) -> Rows:
    prefixes, sequences = _tree(vocab, horizon, eos)
    shape = Instance("", "", 0, vocab, horizon, eos, prefixes, sequences, _EMPTY, _EMPTY)
    return shape.rows(sequences if which == "sequences" else prefixes)


_EMPTY = torch.zeros(0, dtype=DTYPE)
