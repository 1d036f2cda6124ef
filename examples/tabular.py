"""A tiny autoregressive policy shared by the examples.

Vocabulary 4, horizon 4: 256 possible sequences, so every expectation can be
computed exactly by enumeration. The policy is a table of logits, one row per
prefix y_<t (1 + 4 + 16 + 64 = 85 rows), so the choice of y_t changes which
row is used for y_{t+1}: exactly the situation where a per-token KL gradient
is only part of the gradient of the sequence KL.

Nothing here computes a loss: the examples own their losses, so that the
lines kllint reports are in the example files themselves.
"""

from __future__ import annotations

import itertools

import torch
from torch import nn

torch.set_num_threads(1)  # tiny tensors: threads only add overhead

VOCAB = 4
HORIZON = 4
N_PREFIXES = sum(VOCAB**t for t in range(HORIZON))


class TabularPolicy(nn.Module):
    """pi(y_t | y_<t) = softmax(logits[prefix id of y_<t])."""

    def __init__(self, seed: int, scale: float = 1.0) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.logits = nn.Parameter(scale * torch.randn(N_PREFIXES, VOCAB, generator=generator))

    @staticmethod
    def prefix_ids(sequences: torch.Tensor) -> torch.Tensor:
        """[B, T] tokens -> [B, T] id of the prefix each token is sampled from.
        id(empty) = 0, id(prefix + y) = id(prefix) * VOCAB + y + 1."""
        ids = torch.zeros_like(sequences)
        node = torch.zeros_like(sequences[:, 0])
        for t in range(sequences.shape[1]):
            ids[:, t] = node
            node = node * VOCAB + sequences[:, t] + 1
        return ids

    def forward(self, sequences: torch.Tensor) -> torch.Tensor:
        """Per-token log-probabilities log pi(y_t | y_<t), shape [B, T]."""
        log_softmax = self.logits[self.prefix_ids(sequences)].log_softmax(-1)
        return log_softmax.gather(-1, sequences.unsqueeze(-1)).squeeze(-1)

    @torch.no_grad()
    def sample(self, batch_size: int, generator: torch.Generator) -> torch.Tensor:
        sequences = torch.zeros(batch_size, HORIZON, dtype=torch.long)
        node = torch.zeros(batch_size, dtype=torch.long)
        for t in range(HORIZON):
            probs = self.logits[node].softmax(-1)
            sequences[:, t] = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
            node = node * VOCAB + sequences[:, t] + 1
        return sequences


ALL_SEQUENCES = torch.tensor(list(itertools.product(range(VOCAB), repeat=HORIZON)))


def task_reward(sequences: torch.Tensor) -> torch.Tensor:
    """Sequence-level reward: 4 for the sequence 0 0 0 0, else 0. The reference
    gives that sequence little mass, so reaching it costs KL: the regulariser
    decides how far the policy goes."""
    return 4.0 * (sequences == 0).all(-1).float()


@torch.no_grad()
def true_kl(policy: TabularPolicy, reference: TabularPolicy) -> float:
    """KL(pi || pi_ref) of whole sequences, exactly, by enumeration."""
    seq_logp = policy(ALL_SEQUENCES).sum(-1)
    seq_ref_logp = reference(ALL_SEQUENCES).sum(-1)
    return float((seq_logp.exp() * (seq_logp - seq_ref_logp)).sum())


@torch.no_grad()
def expected_reward(policy: TabularPolicy) -> float:
    seq_logp = policy(ALL_SEQUENCES).sum(-1)
    return float((seq_logp.exp() * task_reward(ALL_SEQUENCES)).sum())


@torch.no_grad()
def best_objective(reference: TabularPolicy, beta: float) -> tuple[float, float]:
    """max_pi E[r] - beta * KL(pi || pi_ref), and KL(pi* || pi_ref) at the maximiser
    pi* proportional to pi_ref * exp(r / beta)."""
    seq_ref_logp = reference(ALL_SEQUENCES).sum(-1)
    scaled = task_reward(ALL_SEQUENCES) / beta
    log_z = torch.logsumexp(seq_ref_logp + scaled, 0)
    optimum = seq_ref_logp + scaled - log_z
    kl_star = float((optimum.exp() * (optimum - seq_ref_logp)).sum())
    return beta * float(log_z), kl_star


def exact_expected_gradient(policy: TabularPolicy, reference: TabularPolicy, per_sequence_loss) -> torch.Tensor:
    """E_{y~pi}[grad of per_sequence_loss(y)] exactly: every sequence is weighted
    by its probability, detached (the sampling distribution is not differentiated,
    as in a training step)."""
    per_token_logps = policy(ALL_SEQUENCES)
    with torch.no_grad():
        ref_per_token_logps = reference(ALL_SEQUENCES)
    completion_mask = torch.ones(ALL_SEQUENCES.shape)
    weights = per_token_logps.sum(-1).exp().detach()
    values = per_sequence_loss(per_token_logps, ref_per_token_logps, completion_mask)
    (gradient,) = torch.autograd.grad((weights * values).sum(), policy.logits)
    return gradient


def true_kl_gradient(policy: TabularPolicy, reference: TabularPolicy) -> torch.Tensor:
    """grad KL(pi || pi_ref) of whole sequences, by autograd on the exact sum."""
    seq_logp = policy(ALL_SEQUENCES).sum(-1)
    with torch.no_grad():
        seq_ref_logp = reference(ALL_SEQUENCES).sum(-1)
    exact_divergence = (seq_logp.exp() * (seq_logp - seq_ref_logp)).sum()
    (gradient,) = torch.autograd.grad(exact_divergence, policy.logits)
    return gradient


def compare(name: str, gradient: torch.Tensor, target: torch.Tensor) -> None:
    cosine = float(torch.nn.functional.cosine_similarity(gradient.flatten(), target.flatten(), 0))
    relative_error = float((gradient - target).norm() / target.norm())
    print(f"  {name:<34} cosine {cosine:7.4f}   relative error {relative_error:7.4f}")


def initial_policies() -> tuple[TabularPolicy, TabularPolicy]:
    """(policy, ref_model): two random tables, about 1.8 nats apart, so that the
    run starts far from the reference (where a wrong KL gradient shows)."""
    ref_model = TabularPolicy(seed=0).requires_grad_(False)
    policy = TabularPolicy(seed=1)
    return policy, ref_model


def report(name: str, policy: TabularPolicy, reference: TabularPolicy, beta: float) -> None:
    kl = true_kl(policy, reference)
    reward = expected_reward(policy)
    print(f"  {name:<34} KL(pi||pi_ref) = {kl:6.3f}   E[r] = {reward:5.3f}   "
          f"E[r] - beta*KL = {reward - beta * kl:6.3f}")


def print_optimum(reference: TabularPolicy, beta: float) -> None:
    objective, kl_star = best_objective(reference, beta)
    print(f"  {'optimum pi* ~ pi_ref*exp(r/beta)':<34} KL(pi||pi_ref) = {kl_star:6.3f}   "
          f"{'':18}E[r] - beta*KL = {objective:6.3f}")


__all__ = [
    "ALL_SEQUENCES",
    "HORIZON",
    "VOCAB",
    "TabularPolicy",
    "best_objective",
    "compare",
    "exact_expected_gradient",
    "expected_reward",
    "initial_policies",
    "print_optimum",
    "report",
    "task_reward",
    "true_kl",
    "true_kl_gradient",
]


def train(compute_loss, beta, steps, batch, lr=0.08, seed=123):
    """Sample from the policy, score, and minimise `compute_loss(per_token_logps,
    ref_per_token_logps, rewards, completion_mask, beta)`: the loop every
    example shares, so that only the loss differs between a bug and its fix."""
    policy, ref_model = initial_policies()
    optimizer = torch.optim.Adam(policy.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        completions = policy.sample(batch, generator)
        completion_mask = torch.ones(completions.shape)
        per_token_logps = policy(completions)
        with torch.no_grad():
            ref_per_token_logps = ref_model(completions)
        rewards = task_reward(completions)
        loss = compute_loss(per_token_logps, ref_per_token_logps, rewards, completion_mask, beta)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return policy, ref_model
