"""KL terms behind library objects and wrappers: an exact KL written as a
cross-entropy minus ``Categorical.entropy()``, a ``@contextmanager`` of the
project that enters ``no_grad``, loss modules held in an ``nn.ModuleDict``,
a score-function helper that returns one value per sequence, and a
log-softmax written out with the max added back to the log-sum of exps.
Each has its correct twin, which stays quiet."""

from __future__ import annotations

import textwrap
from pathlib import Path

from kllint.engine import lint_paths


def findings(tmp_path: Path, source: str) -> list[tuple[int, str]]:
    path = tmp_path / "loss.py"
    path.write_text(textwrap.dedent(source))
    return [(f.line, f.code) for f in lint_paths([path], jobs=1).findings]


CROSS_ENTROPY = """
import torch
from torch.distributions import Categorical


def compute_loss(logits, ref_logits, ids, mask, advantages, coef=0.02):
    pi = Categorical(logits=logits)
    ref = Categorical(logits=ref_logits.detach())
    pg = -(advantages[:, None] * pi.log_prob(ids) * mask).sum(-1).mean()
    {kl_lines}
    return pg + coef * kl_loss
"""


def test_a_cross_entropy_minus_the_entropy_is_the_exact_kl(tmp_path: Path) -> None:
    # sum_v p log p - p log q at each position, summed over the policy's own
    # tokens: the token-level part of the sequence gradient (KL003).
    kl_lines = """cross_entropy = -(pi.probs * ref.logits).sum(-1)
    token_kl = cross_entropy - pi.entropy()
    kl_loss = (token_kl * mask).sum(-1).mean()"""
    assert findings(tmp_path, CROSS_ENTROPY.format(kl_lines=kl_lines)) == [(11, "KL003")]


def test_an_entropy_bonus_beside_a_sequence_k2_says_nothing(tmp_path: Path) -> None:
    kl_lines = """log_ratio = ((pi.log_prob(ids) - ref.log_prob(ids)) * mask).sum(-1)
    kl_loss = 0.5 * log_ratio.pow(2).mean() - 0.01 * (pi.entropy() * mask).sum(-1).mean()"""
    assert findings(tmp_path, CROSS_ENTROPY.format(kl_lines=kl_lines)) == []


REFERENCE_CONTEXT = """
from contextlib import contextmanager

import torch


@contextmanager
def reference_adapter(model):
    with model.disable_adapter(), torch.no_grad():
        yield model


def logps_of(model, ids):
    logits = model(ids).logits[:, :-1]
    return logits.log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def compute_loss(model, ids, mask, advantages, beta=0.04):
    logps = logps_of(model, ids)
    with reference_adapter(model):
        ref_logps = logps_of(model, ids)
{inside}
{after}
    pg = -(torch.exp(logps - logps.detach()) * advantages[:, None] * mask).sum(1)
    loss = (pg + beta * seq_kl).mean()
    loss.backward()
"""
SEQUENCE_K2 = "seq_kl = 0.5 * ((logps - ref_logps) * mask).sum(1) ** 2"


def test_a_kl_written_inside_a_generator_context_has_no_gradient(tmp_path: Path) -> None:
    # ``reference_adapter`` enters ``torch.no_grad()`` around its ``yield``.
    source = REFERENCE_CONTEXT.format(inside="        " + SEQUENCE_K2, after="")
    assert findings(tmp_path, source) == [(22, "KL005")]


def test_the_same_kl_written_after_the_block_is_right(tmp_path: Path) -> None:
    source = REFERENCE_CONTEXT.format(inside="", after="    " + SEQUENCE_K2)
    assert findings(tmp_path, source) == []


MODULE_DICT = """
import torch
import torch.nn as nn


class PolicyLoss(nn.Module):
    def forward(self, batch):
        ratio = torch.exp(batch["logps"] - batch["old_logps"])
        return -(ratio * batch["advantages"][:, None] * batch["mask"]).sum(-1).mean()


class KLPenalty(nn.Module):
    def __init__(self, beta):
        super().__init__()
        self.beta = beta

    def forward(self, batch):
        log_ratio = (batch["logps"] - batch["ref_logps"]) * batch["mask"]
        {estimate}
        return self.beta * kl.mean()


class LossStack(nn.Module):
    def __init__(self, beta=0.04):
        super().__init__()
        self.losses = nn.ModuleDict({{"policy": PolicyLoss()}})
        if beta != 0.0:
            self.losses["kl"] = KLPenalty(beta)

    def forward(self, batch):
        return sum(loss(batch) for loss in self.losses.values())


class Trainer:
    def __init__(self, model):
        self.model = model
        self.loss_stack = LossStack()

    def step(self, batch, optimizer):
        logits = self.model(batch["ids"]).logits[:, :-1]
        batch["logps"] = logits.log_softmax(-1).gather(-1, batch["ids"][:, 1:, None]).squeeze(-1)
        loss = self.loss_stack(batch)
        loss.backward()
        optimizer.step()
"""


def test_a_kl_module_held_in_a_module_dict_is_summed_into_the_loss(tmp_path: Path) -> None:
    # The k1 of ``KLPenalty`` (its log-ratio), differentiated as a loss (KL001).
    source = MODULE_DICT.format(estimate="kl = log_ratio.sum(-1)")
    assert findings(tmp_path, source) == [(18, "KL001")]


def test_a_sequence_k2_module_in_the_same_dict_is_right(tmp_path: Path) -> None:
    source = MODULE_DICT.format(estimate="kl = 0.5 * log_ratio.sum(-1) ** 2")
    assert findings(tmp_path, source) == []


PREFIX_SUM = """
import torch


def kl_score_function_loss(logprobs, ref_logprobs, mask):
    log_ratio = ((logprobs - ref_logprobs) * mask).detach()
    T = log_ratio.shape[-1]
    kl_to_go = log_ratio @ torch.ones(T, T).{triangle}()
    kl_penalty = (kl_to_go * logprobs * mask).sum(-1)
    return kl_penalty


def policy_loss(logprobs, ref_logprobs, advantages, mask, coef=0.02):
    pg = -(torch.exp(logprobs - logprobs.detach()) * advantages * mask).sum(-1).mean()
    kl = kl_score_function_loss(logprobs, ref_logprobs, mask)
    return pg + coef * kl.mean()
"""


def test_a_per_sequence_score_function_helper_is_reported_inside_it(tmp_path: Path) -> None:
    # ``x @ triu(ones)`` sums each token's past log-ratios, not its future
    # ones: the token-level gradient, on the line that weights the log-probs.
    assert findings(tmp_path, PREFIX_SUM.format(triangle="triu")) == [(9, "KL003")]


def test_the_reward_to_go_written_the_same_way_is_right(tmp_path: Path) -> None:
    assert findings(tmp_path, PREFIX_SUM.format(triangle="tril")) == []


PARTIAL = """
import functools

import torch


def grpo_loss(logprobs, ref_logprobs, advantages, mask, *, beta, kl_level="token"):
    pg = -(torch.exp(logprobs - logprobs.detach()) * advantages * mask).sum(-1).mean()
    log_ratio = (logprobs - ref_logprobs) * mask
    if kl_level == "sequence":
        log_ratio = log_ratio.sum(-1, keepdim=True)
    kl = 0.5 * log_ratio.square()
    return pg + beta * kl.sum(-1).mean()


def make_loss_fn(beta):
    return functools.partial(grpo_loss, beta=beta{level})
"""


def test_a_default_that_no_call_leaves_in_place_is_not_judged(tmp_path: Path) -> None:
    # Every call of ``grpo_loss`` in the file (the partial) picks the sequence k2.
    assert findings(tmp_path, PARTIAL.format(level=', kl_level="sequence"')) == []


def test_the_default_a_call_leaves_in_place_is_judged(tmp_path: Path) -> None:
    # The per-token k2, summed: the token-level gradient (KL003).
    assert findings(tmp_path, PARTIAL.format(level="")) == [(12, "KL003")]


WRAPPED_DISTRIBUTION = """
import torch
from torch.distributions import Categorical


class MaskedIndependent:
    def __init__(self, base: Categorical, mask):
        self.base = base
        self.mask = mask

    def log_prob(self, value):
        return (self.base.log_prob(value) * self.mask).sum(-1)


def compute_loss(logits, ref_logits, ids, mask, advantages, coef=0.05):
    pi = MaskedIndependent(Categorical(logits=logits), mask)
    with torch.no_grad():
        ref = MaskedIndependent(Categorical(logits=ref_logits), mask)
    pg = -(advantages[:, None] * pi.base.log_prob(ids) * mask).sum(-1).mean()
    seq_log_ratio = pi.log_prob(ids) - ref.log_prob(ids)
    return pg + coef * {kl}
"""


def test_a_distribution_passed_to_a_wrapper_keeps_whose_it_is(tmp_path: Path) -> None:
    # ``base: Categorical`` names the wrapped distribution, not the base model:
    # the policy's sequence log-ratio, differentiated as a loss (KL001).
    assert findings(tmp_path, WRAPPED_DISTRIBUTION.format(kl="seq_log_ratio.mean()")) == [
        (20, "KL001")
    ]


def test_the_sequence_k2_through_the_same_wrapper_is_right(tmp_path: Path) -> None:
    kl = "0.5 * seq_log_ratio.pow(2).mean()"
    assert findings(tmp_path, WRAPPED_DISTRIBUTION.format(kl=kl)) == []


STABILISED_LOG_SOFTMAX = """
import torch


def token_logprobs(logits, index):
    logits = {logits_line}
    row_max = logits.amax(dim=-1, keepdim=True)
    lse = row_max + torch.log(torch.exp(logits - row_max).sum(dim=-1, keepdim=True))
    token_logits = torch.gather(logits, dim=-1, index=index.unsqueeze(-1))
    return (token_logits - lse).squeeze(-1)


def compute_loss(logits, ref_logits, input_ids, advantages, loss_mask, beta=0.1):
    policy_logprobs = torch.gather(logits.log_softmax(-1), -1, input_ids.unsqueeze(-1)).squeeze(-1)
    pg_loss = -(advantages.unsqueeze(-1) * policy_logprobs * loss_mask).sum(-1).mean()
    logprobs = token_logprobs(logits, input_ids)
    ref_logprobs = token_logprobs(ref_logits, input_ids)
    log_ratio = (logprobs - ref_logprobs) * loss_mask
    kl = 0.5 * log_ratio.sum(dim=-1).square()
    loss = pg_loss + beta * kl.mean()
    loss.backward()
"""


def test_a_kl_of_log_probs_read_through_data_is_reported(tmp_path: Path) -> None:
    # ``row_max + log(sum(exp(z - row_max)))`` is z's logsumexp, so the
    # gathered logits minus it are log-probs; of ``.data``, without gradient.
    source = STABILISED_LOG_SOFTMAX.format(logits_line="logits.data.to(torch.float32)")
    assert findings(tmp_path, source) == [(19, "KL005")]


def test_a_sequence_k2_of_those_log_probs_with_their_graph_says_nothing(tmp_path: Path) -> None:
    source = STABILISED_LOG_SOFTMAX.format(logits_line="logits.to(torch.float32)")
    assert findings(tmp_path, source) == []
