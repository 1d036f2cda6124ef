"""The KL term followed through the bookkeeping around it: a batch copied
with entries added, rows a data loader yields, a distribution held under a
name, contractions written with ``tensordot``, ``tril`` and a stacked
vector of coefficients, and a fallback definition that an import replaces.
Each shape lost the term before; each has its correct twin, which stays quiet."""

from __future__ import annotations

import textwrap
from pathlib import Path

from kllint.engine import lint_paths


def findings(tmp_path: Path, source: str, name: str = "trainer.py") -> list[tuple[int, str]]:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return [(f.line, f.code) for f in lint_paths([tmp_path], jobs=1).findings]


LOGP = """
import torch


def logp_of(model, ids):
    logits = model(ids).logits[:, :-1]
    return logits.log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
"""


def test_a_batch_copied_with_a_kl_entry_added(tmp_path: Path) -> None:
    # ``dict(data, kl=...)``: the k3 computed under no_grad in the first pass
    # is read back as ``mb["kl"]`` in the loss, where it has no gradient.
    source = (
        LOGP
        + """

def train(policy, ref_model, optimizer, data):
    with torch.no_grad():
        old = logp_of(policy, data["ids"])
        ref = logp_of(ref_model, data["ids"])
        kl = torch.exp(ref - old) - (ref - old) - 1
    data = dict(data, kl=kl)
    mb = {k: v[0:4] for k, v in data.items()}
    logp = logp_of(policy, mb["ids"])
    pg = -(mb["advantages"][:, None] * logp * mb["mask"]).sum()
    loss = pg + 0.1 * (mb["kl"] * mb["mask"]).sum()
    loss.backward()
    optimizer.step()
"""
    )
    assert findings(tmp_path, source) == [(14, "KL005")]


def test_log_probs_a_data_loader_yields_are_stored(tmp_path: Path) -> None:
    # ``lp`` is what the sampler stored: a sequence k2 of it has no gradient,
    # whatever a terse name would suggest.
    source = (
        LOGP
        + """

def seq_kl(x, y, m):
    return 0.5 * ((x - y) * m).sum(-1).pow(2)


def train(policy, ref_model, optimizer, sampler):
    for ids, m, lp, adv in torch.utils.data.DataLoader(sampler):
        with torch.no_grad():
            lr = logp_of(ref_model, ids)
        cur = logp_of(policy, ids)
        pg = -(torch.exp(cur - lp) * adv[:, None] * m).sum(-1)
        loss = (pg + 0.05 * seq_kl(lp, lr, m)).mean()
        loss.backward()
        optimizer.step()
"""
    )
    assert findings(tmp_path, source) == [(20, "KL005")]


DISTRIBUTION = """
import torch
from torch.distributions import Categorical


def kl_to_go_loss(logp, ref_logp, mask):
    log_ratio = (logp - ref_logp).detach() * mask
    kl_to_go = log_ratio.flip(-1).cumsum(-1).flip(-1)
    return (kl_to_go * logp * mask).sum(-1).mean()


class Actor:
    def __init__(self):
        self._old_dist = None

    @torch.no_grad()
    def cache_old_policy(self, old_logits):
        self._old_dist = Categorical(logits=old_logits)

    def loss(self, logits, ref_logits, tokens, mask):
        pi = Categorical(logits=logits)
        old_dist = self._old_dist
        ref = Categorical(logits=ref_logits.detach())
        return kl_to_go_loss({given}.log_prob(tokens), ref.log_prob(tokens), mask)

    def update(self, batch, optimizer):
        loss = self.loss(batch["logits"], batch["ref_logits"], batch["tokens"], batch["mask"])
        loss.backward()
        optimizer.step()
"""


def test_a_held_distribution_keeps_the_name_the_caller_gave_it(tmp_path: Path) -> None:
    # ``old_dist.log_prob(tokens)`` given to a helper's ``logp``: the cached old
    # policy's log-probs, without gradient, not the policy's.
    assert findings(tmp_path, DISTRIBUTION.format(given="old_dist")) == [(24, "KL005")]


def test_the_fresh_distribution_given_to_the_same_helper_is_right(tmp_path: Path) -> None:
    assert findings(tmp_path, DISTRIBUTION.format(given="pi")) == []


def test_tensordot_with_ones_sums_over_time(tmp_path: Path) -> None:
    # ``tensordot(x, ones(T), dims=([1], [0]))``: each sequence's sum of a k3
    # computed under no_grad.
    source = """
import torch


def loss_fn(logprobs, ref_logprobs, advantages, mask):
    ones_t = torch.ones(logprobs.shape[1])
    pg = -(torch.exp(logprobs - logprobs.detach()) * advantages[:, None] * mask).sum()
    with torch.no_grad():
        per_token_kl = torch.exp(ref_logprobs - logprobs) - (ref_logprobs - logprobs) - 1
    kl_per_seq = torch.tensordot(per_token_kl * mask, ones_t, dims=([1], [0]))
    return pg + 0.05 * kl_per_seq.mean()
"""
    assert findings(tmp_path, source, "loss.py") == [(9, "KL005")]


def test_a_lower_triangular_matmul_is_a_reward_to_go(tmp_path: Path) -> None:
    # ``rewards @ torch.ones(T, T).tril()``: returns of a k3 reward (KL004).
    source = """
import torch


@torch.no_grad()
def compute_reward(log_probs, ref_log_probs, mask, kl_coef=0.01):
    log_ratio = log_probs - ref_log_probs
    kl = torch.expm1(-log_ratio) + log_ratio
    return -kl_coef * kl * mask


def policy_loss(log_probs, ref_log_probs, mask):
    rewards = compute_reward(log_probs.detach(), ref_log_probs, mask)
    T = rewards.shape[-1]
    returns = rewards @ torch.ones(T, T).tril()
    return -(returns * log_probs * mask).sum(-1).mean()
"""
    assert findings(tmp_path, source, "loss.py") == [(8, "KL004")]


STACKED = """
import torch


def actor_loss(logprobs, ref_logprobs, advantages, mask, kl_ctl=0.1):
    pg_loss = -(torch.exp(logprobs - logprobs.detach()) * advantages[:, None] * mask).sum(-1).mean()
    kl_loss = 0.5 * ((logprobs - ref_logprobs) * mask).sum(-1).square().mean()
    coefs = pg_loss.new_tensor([1.0, {sign}kl_ctl])
    return torch.stack([pg_loss, kl_loss]) @ coefs
"""


def test_a_penalty_subtracted_by_its_stacked_coefficient(tmp_path: Path) -> None:
    # ``stack([pg, kl]) @ [1, -kl_ctl]``: a sequence k2, negated (KL006).
    assert findings(tmp_path, STACKED.format(sign="-"), "loss.py") == [(7, "KL006")]


def test_a_penalty_added_by_its_stacked_coefficient(tmp_path: Path) -> None:
    assert findings(tmp_path, STACKED.format(sign=""), "loss.py") == []


FALLBACK = """
from .ops import sum_of_tokens{imported}


def compute_approx_kl(log_probs, ref_log_probs):
    log_ratio = ref_log_probs - log_probs
    return log_ratio.exp() - log_ratio - 1
{reimport}

def policy_loss(log_probs, ref_log_probs, advantages, mask):
    pg = -(advantages[:, None] * log_probs * mask).sum(-1).mean()
    kl = compute_approx_kl(log_probs, ref_log_probs)
    return pg + 0.05 * sum_of_tokens(kl, mask)
"""

OPS = """
def sum_of_tokens(x, mask):
    return (x * mask).sum(-1).mean()


def compute_approx_kl(log_probs, ref_log_probs):
    # The log-ratio's value with the reward-to-go gradient: the sequence KL's.
    log_ratio = (log_probs - ref_log_probs).detach()
    kl_to_go = log_ratio.flip(-1).cumsum(-1).flip(-1)
    return log_ratio + kl_to_go * (log_probs - log_probs.detach())
"""


def package(tmp_path: Path, imported: str, reimport: str) -> list[tuple[str, int, str]]:
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "ops.py").write_text(textwrap.dedent(OPS))
    (root / "loss.py").write_text(
        textwrap.dedent(FALLBACK.format(imported=imported, reimport=reimport))
    )
    return [(Path(f.path).name, f.line, f.code) for f in lint_paths([root], jobs=1).findings]


def test_an_import_after_a_fallback_definition_replaces_it(tmp_path: Path) -> None:
    # ``try: from .ops import compute_approx_kl``: the k3 above is a fallback
    # the default run never calls.
    reimport = """
try:
    from .ops import compute_approx_kl
except ImportError:
    pass
"""
    assert package(tmp_path, "", reimport) == []


def test_a_definition_after_an_import_shadows_it(tmp_path: Path) -> None:
    # The k3 written after ``from .ops import compute_approx_kl`` is the one called.
    assert package(tmp_path, ", compute_approx_kl", "") == [("loss.py", 12, "KL002")]
