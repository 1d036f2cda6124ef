"""Per-token KL terms reduced with a bare ``.sum()``, where the time axis shows only indirectly.

The log-probs come from ``[B, T, V]`` logits (``logits.log_softmax(-1).gather(-1, ids[..., None])
.squeeze(-1)`` gives ``[B, T]``), and the sequence advantages are broadcast over tokens
(``advantages[:, None]``, ``.unsqueeze(1)``). A bare ``.sum()`` then sums over tokens and
sequences alike: with k2 or the score function per token, that is the token-level partial
gradient of the sequence KL(pi||pi_ref) (KL003).

The same spellings on per-sequence log-probs (``.sum(-1)`` first, shape ``[B]``), or on a
one-step policy (a bandit over a classifier head), are the full gradient: quiet.

Fixture: parsed by the tests, never executed.
"""

from __future__ import annotations

import torch


def gather_logps(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return logits.log_softmax(-1).gather(-1, ids[..., None]).squeeze(-1)


def response_logits(model, input_ids, prompt_len: int) -> torch.Tensor:
    return model(input_ids).logits[:, prompt_len - 1 : -1].float()


def k2_token_sum_step(model, ref_model, optimizer, input_ids, prompt_len, advantages, beta=0.1):
    response_ids = input_ids[:, prompt_len:]
    logp = response_logits(model, input_ids, prompt_len).log_softmax(-1).gather(-1, response_ids[..., None]).squeeze(-1)
    with torch.no_grad():
        ref_logp = gather_logps(response_logits(ref_model, input_ids, prompt_len), response_ids)
    pg = -(advantages[:, None] * logp).sum()
    # error: KL003
    kl = 0.5 * (logp - ref_logp) ** 2
    total = pg + beta * kl.sum()
    optimizer.zero_grad()
    total.backward()
    optimizer.step()


def score_function_token_sum_step(model, ref_model, optimizer, input_ids, prompt_len, advantages, beta=0.1):
    response_ids = input_ids[:, prompt_len:]
    logp = gather_logps(response_logits(model, input_ids, prompt_len), response_ids)
    with torch.no_grad():
        ref_logp = gather_logps(response_logits(ref_model, input_ids, prompt_len), response_ids)
    pg = -(advantages.unsqueeze(1) * logp).sum()
    # error: KL003
    kl = (logp - ref_logp).detach() * logp
    (pg + beta * kl.sum()).backward()
    optimizer.step()
    optimizer.zero_grad()


def k2_sequence_step(model, ref_model, optimizer, input_ids, prompt_len, advantages, beta=0.1):
    response_ids = input_ids[:, prompt_len:]
    seq_logp = gather_logps(response_logits(model, input_ids, prompt_len), response_ids).sum(-1)
    with torch.no_grad():
        seq_ref_logp = gather_logps(response_logits(ref_model, input_ids, prompt_len), response_ids).sum(-1)
    pg = -(advantages * seq_logp).sum()
    # ok: KL001, KL002, KL003, KL004, KL005, KL006
    kl = 0.5 * (seq_logp - seq_ref_logp) ** 2
    total = pg + beta * kl.sum()
    optimizer.zero_grad()
    total.backward()
    optimizer.step()


def score_function_sequence_step(model, ref_model, optimizer, input_ids, prompt_len, advantages, beta=0.1):
    response_ids = input_ids[:, prompt_len:]
    seq_logp = gather_logps(response_logits(model, input_ids, prompt_len), response_ids).sum(-1)
    with torch.no_grad():
        seq_ref_logp = gather_logps(response_logits(ref_model, input_ids, prompt_len), response_ids).sum(-1)
    pg = -(advantages * seq_logp).sum()
    # ok: KL001, KL002, KL003, KL004, KL005, KL006
    kl = (seq_logp - seq_ref_logp).detach() * seq_logp
    (pg + beta * kl.sum()).backward()
    optimizer.step()
    optimizer.zero_grad()


class ContextualBandit:
    """One action per context from a classifier head: logits are [B, V], log-probs [B]."""

    def __init__(self, policy_head, ref_head, optimizer, beta: float = 0.1):
        self.policy_head = policy_head
        self.ref_head = ref_head
        self.optimizer = optimizer
        self.beta = beta

    def step(self, features, actions, rewards):
        logp = gather_logps(self.policy_head(features), actions)
        with torch.no_grad():
            ref_logp = gather_logps(self.ref_head(features), actions)
            baseline = rewards.mean()
        pg = -((rewards - baseline) * logp).sum()
        # ok: KL001, KL002, KL003, KL004, KL005, KL006
        kl = 0.5 * (logp - ref_logp) ** 2
        total = pg + self.beta * kl.sum()
        self.optimizer.zero_grad()
        total.backward()
        self.optimizer.step()
