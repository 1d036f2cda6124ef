"""A small tabular training experiment: what each estimator does to a policy.

The policy is the variable-length tabular policy of the harness (vocabulary 4
with an end token, up to 4 tokens, 121 sequences). At every step each
estimator's surrogate is differentiated *exactly* (its expectation over every
sequence, as the harness computes it), so the curves show bias, not
Monte-Carlo noise: a biased estimator fails with any batch size.

Two problems:

1. KL alone: descend the estimator's gradient from a policy ~2.8 nats from
   the reference. Any estimator whose expected gradient vanishes only at
   pi = pi_ref drives KL(pi||pi_ref) to 0, whatever divergence it follows
   (k2, k3, the reward-to-go); k1 (zero expected gradient) leaves it where it
   is, and k3 as a reward or an importance-weighted k2 stop elsewhere.
2. Reward minus beta times the KL, from the reference: ascend
   ``grad E[r] - beta * E[grad surrogate]``. The regularised optimum is
   ``pi*(y) ∝ pi_ref(y) exp(r(y) / beta)``; a correct estimator converges to it,
   every other one converges elsewhere (or nowhere) and its true objective
   stays below the optimum.

Steps are preconditioned per prefix by 1 / P_pi(h), the probability of
reaching the prefix (a diagonal, positive rescaling: it changes the speed, not
the fixed points), so that late tokens learn as fast as early ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kllint.analysis import ir
from kllint.harness import tabular
from kllint.harness.compile import expected_gradient

BETA = 0.5
REWARD_SCALE = 1.0
STEPS = 400
LEARNING_RATE = 1.0
SEED = 0
FLOOR = 1e-8  # log-scale plots clip here


@dataclass(frozen=True)
class Curve:
    name: str
    kl: list[float]  # true KL(pi||pi_ref) at each step
    objective: list[float]  # true E[r] - beta * KL(pi||pi_ref) (problem 2), or KL (problem 1)


def _kl(inst: tabular.Instance, logits: torch.Tensor, rows: tabular.Rows) -> float:
    with torch.no_grad():
        logp = tabular.token_logp(logits, rows).sum(dim=1)
        ref = tabular.token_logp(inst.reference_logits, rows).sum(dim=1)
        return float((logp.exp() * (logp - ref)).sum())


def _reach(inst: tabular.Instance, logits: torch.Tensor) -> torch.Tensor:
    """P_pi(h) for each prefix row, [P, 1]."""
    paths = tabular.prefix_paths(inst)
    with torch.no_grad():
        return tabular.token_logp(logits, paths).sum(dim=1).exp().unsqueeze(1)


def rewards(inst: tabular.Instance, seed: int = SEED) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 + seed)
    return REWARD_SCALE * torch.randn(len(inst.sequences), generator=generator, dtype=tabular.DTYPE)


def optimum(
    inst: tabular.Instance, reward: torch.Tensor, beta: float = BETA
) -> tuple[float, float]:
    """``(J*, KL(pi*||pi_ref))`` for ``J = E[r] - beta KL``: the Gibbs policy."""
    rows = tabular.all_sequences(inst)
    ref = tabular.token_logp(inst.reference_logits, rows).sum(dim=1)
    log_z = torch.logsumexp(ref + reward / beta, dim=0)
    log_star = ref + reward / beta - log_z
    p_star = log_star.exp()
    return float(beta * log_z), float((p_star * (log_star - ref)).sum())


def train(
    term: ir.Node,
    *,
    with_reward: bool,
    steps: int = STEPS,
    lr: float = LEARNING_RATE,
    beta: float = BETA,
    seed: int = SEED,
) -> Curve:
    inst = tabular.instance(tabular.VARIABLE_LENGTH, seed)
    reward = rewards(inst, seed)
    logits = (inst.reference_logits if with_reward else inst.policy_logits).clone()
    kls, objectives = [], []
    for _ in range(steps + 1):
        rows = tabular.enumerated(inst, logits)
        kl = _kl(inst, logits, rows)
        expected_reward = float((rows.weight * reward).sum())
        kls.append(kl)
        objectives.append(expected_reward - beta * kl if with_reward else kl)
        kl_grad, _ = expected_gradient(term, logits, inst.reference_logits, rows)
        step = -kl_grad.reshape(logits.shape)
        if with_reward:
            theta = logits.clone().requires_grad_(True)
            logp = tabular.token_logp(theta, rows).sum(dim=1)
            (reward_grad,) = torch.autograd.grad((logp.exp() * reward).sum(), theta)
            step = reward_grad + beta * step
        logits = logits + lr * step / _reach(inst, logits).clamp_min(1e-3)
    return Curve("", kls, objectives)
