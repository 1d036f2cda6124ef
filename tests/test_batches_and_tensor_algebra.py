"""The KL term followed through the bookkeeping around it: a batch copied
with entries added, rows a data loader yields, a distribution held under a
name, contractions written with ``tensordot``, ``tril`` and a stacked
vector of coefficients, a fallback definition that an import replaces, row
coefficients picked by ``torch.where``, a KL to a second reference, and a
score-function term formed under ``no_grad``. Each shape lost the term (or
placed it elsewhere) before; each has its correct twin, which stays quiet."""

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


ROWS = """
import torch


def mixed_loss(logps, ref_logps, mask, is_on_policy, advantages, beta=0.05, sft_coef=0.1):
    log_ratio = ((logps - ref_logps) * mask).detach()
    kl_to_go = log_ratio.flip(-1).cumsum(-1).flip(-1)
    kl_penalty = (kl_to_go * logps * mask).sum(-1)
    nll = -(logps * mask).sum(-1)
    pg = -(advantages[:, None] * logps * mask).sum(-1)
    row_term = torch.where(is_on_policy, kl_penalty, nll)
    row_coef = torch.where(is_on_policy, torch.full_like(nll, {sign}beta), torch.full_like(nll, sft_coef))
    return (pg * is_on_policy + row_coef * row_term).mean()
"""


def test_a_row_coefficient_picked_by_where_carries_its_sign(tmp_path: Path) -> None:
    # The on-policy rows weight the KL penalty by ``-beta``: negated (KL006).
    assert findings(tmp_path, ROWS.format(sign="-"), "loss.py") == [(8, "KL006")]


def test_the_same_rows_weighted_by_plus_beta_are_right(tmp_path: Path) -> None:
    assert findings(tmp_path, ROWS.format(sign=""), "loss.py") == []


TWO_REFERENCES = """
import torch


def ppo_loss(logprobs, data, sft_kl_ctl=0.02, reset_kl_ctl=0.1):
    mask = data["loss_mask"]
    sft_kl = 0.5 * ((logprobs - data["ref_logp"]) * mask).sum(-1).square()
    {guard}
    {indent}reset_logp = data["reset_ref_logp"]
    {indent}reset_kl = 0.5 * ((logprobs - reset_logp) * mask).sum(-1).square()
    return sft_kl_ctl * sft_kl.mean() + reset_kl_ctl * reset_kl.mean()
"""


def test_a_kl_to_a_second_reference_is_judged_on_its_own(tmp_path: Path) -> None:
    # ``reset_logp`` is read from the reset reference's entry; its KL, written
    # under ``no_grad``, has no gradient beside the first KL, which has one.
    source = TWO_REFERENCES.format(guard="with torch.no_grad():", indent="    ")
    assert findings(tmp_path, source, "loss.py") == [(10, "KL005")]


def test_two_kls_to_two_references_each_with_its_gradient_are_right(tmp_path: Path) -> None:
    assert findings(tmp_path, TWO_REFERENCES.format(guard="", indent=""), "loss.py") == []


NO_GRAD_SCORE = """
import torch


def kl_loss(logprobs, ref_logprobs, mask):
    with torch.no_grad():
        log_ratio = (logprobs - ref_logprobs) * mask
        kl_to_go = log_ratio.flip(-1).cumsum(-1).flip(-1)
{penalty}
    return kl_penalty.mean()
"""
PENALTY = "kl_penalty = (kl_to_go * logprobs * mask).sum(-1)"


def test_a_score_function_term_formed_under_no_grad_is_reported_on_its_line(
    tmp_path: Path,
) -> None:
    # The product named as the penalty is the estimate, here without gradient.
    source = NO_GRAD_SCORE.format(penalty="        " + PENALTY)
    assert findings(tmp_path, source, "loss.py") == [(9, "KL005")]


def test_the_product_formed_after_the_block_is_right(tmp_path: Path) -> None:
    assert findings(tmp_path, NO_GRAD_SCORE.format(penalty="    " + PENALTY), "loss.py") == []


GAE_LIST = """
import torch


@torch.no_grad()
def advantages_of(log_probs, ref_log_probs, scores, mask, kl_coef=0.01, gamma=1.0, lam=1.0):
    log_ratio = log_probs - ref_log_probs
    kl = {estimate}
    rewards = -kl_coef * kl * mask
    rewards[:, -1] += scores
    lastgaelam = torch.zeros_like(scores)
    advantages_reversed = []
    for t in reversed(range(rewards.size(1))):
        lastgaelam = rewards[:, t] + gamma * lam * lastgaelam
        advantages_reversed.append(lastgaelam)
    return torch.stack(list(reversed(advantages_reversed)), dim=1)


def policy_loss(log_probs, ref_log_probs, scores, mask):
    advantages = advantages_of(log_probs.detach(), ref_log_probs, scores, mask)
    return -(advantages * log_probs * mask).sum(-1).mean()
"""


def test_gae_steps_put_back_in_order_with_reversed_are_returns(tmp_path: Path) -> None:
    # ``torch.stack(list(reversed(steps)))`` of a backward GAE loop: the k3
    # reward is credited by returns (KL004).
    source = GAE_LIST.format(estimate="torch.expm1(-log_ratio) + log_ratio")
    assert findings(tmp_path, source, "loss.py") == [(8, "KL004")]


def test_the_k1_reward_through_the_same_loop_is_right(tmp_path: Path) -> None:
    assert findings(tmp_path, GAE_LIST.format(estimate="log_ratio"), "loss.py") == []


CONTEXT_PARALLEL = """
import torch
import torch.distributed as dist


def gather_chunks(tensor, group=None):
    chunks = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group=group))]
    dist.all_gather(chunks, tensor.contiguous(), group=group)
{own_chunk}
    return torch.cat(chunks, dim=-1)


def kl_loss(log_probs, ref_log_probs, mask, group=None):
    full = gather_chunks(log_probs, group)
    full_ref = gather_chunks(ref_log_probs, group)
    full_mask = gather_chunks(mask, group)
    seq_log_ratio = ((full - full_ref) * full_mask).sum(-1)
    return (0.5 * seq_log_ratio.pow(2)).mean()
"""


def test_log_probs_gathered_into_buffers_have_no_gradient(tmp_path: Path) -> None:
    # ``dist.all_gather`` writes copies without a graph: the sequence k2 of
    # them regularises nothing (KL005).
    source = CONTEXT_PARALLEL.format(own_chunk="")
    assert findings(tmp_path, source, "loss.py") == [(18, "KL005")]


def test_the_own_chunk_put_back_keeps_the_gradient(tmp_path: Path) -> None:
    own = "    chunks[dist.get_rank(group=group)] = tensor"
    assert findings(tmp_path, CONTEXT_PARALLEL.format(own_chunk=own), "loss.py") == []
