"""KL terms that reach the loss through generators, callbacks and settings
chosen in a constructor: a generator that yields one loss per micro-batch
(and ``itertools.chain`` of two), a callback object that writes the loss
into the dict it is handed, a reducer picked by an ``if`` in ``__init__``,
an index a helper is given by its caller's settings, and a soft-RL reward
whose entropy bonus sits beside the KL. Each has its correct twin, which
stays quiet."""

from __future__ import annotations

import textwrap
from pathlib import Path

from kllint.engine import lint_paths


def findings(tmp_path: Path, source: str, name: str = "loss.py") -> list[tuple[int, str]]:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return [(f.line, f.code) for f in lint_paths([path], jobs=1).findings]


MICRO_LOSSES = """
import asyncio

import torch


class Actor:
    def __init__(self, engine, ref_engine, coef=0.05):
        self.engine = engine
        self.ref_engine = ref_engine
        self.coef = coef

    async def _logps(self, mb):
        return self.engine.log_probs(mb["input_ids"])

    async def _ref_logps(self, mb):
        return await self.ref_engine.log_probs(mb["input_ids"])

    async def _micro_losses(self, batch):
        for mb in batch.split(4):
            logp, ref_logp = await asyncio.gather(self._logps(mb), self._ref_logps(mb))
            mask = mb["mask"]
            pg = -(mb["advantages"][:, None] * logp)
            {kl_line}
            yield ((pg + self.coef * kl) * mask).sum(-1).mean()

    async def train_batch(self, batch):
        async for loss in self._micro_losses(batch):
            loss.backward()
"""


def test_a_k3_loss_yielded_per_micro_batch_is_reported(tmp_path: Path) -> None:
    # The loop over the generator takes each loss it yields to ``.backward()``.
    kl_line = "kl = torch.exp(ref_logp - logp) - (ref_logp - logp) - 1"
    assert findings(tmp_path, MICRO_LOSSES.format(kl_line=kl_line)) == [(24, "KL002")]


def test_a_sequence_k2_yielded_per_micro_batch_says_nothing(tmp_path: Path) -> None:
    kl_line = "kl = 0.5 * ((logp - ref_logp) * mask).sum(-1, keepdim=True) ** 2 / mask.shape[-1]"
    assert findings(tmp_path, MICRO_LOSSES.format(kl_line=kl_line)) == []


CHAINED = """
import itertools

import torch


class Trainer:
    def __init__(self, model, coef=0.04):
        self.model = model
        self.coef = coef

    def _pg_losses(self, batch):
        for mb in batch.split(4):
            logps = self.model.log_probs(mb["input_ids"])
            yield -(mb["advantages"][:, None] * logps * mb["mask"]).sum(-1).mean()

    def _kl_losses(self, batch):
        for mb in batch.split(4):
            logps = self.model.log_probs(mb["input_ids"])
            log_ratio = logps - mb["ref_logps"]
            {kl_line}
            yield self.coef * (kl * mb["mask"]).sum(-1).mean()

    def training_step(self, batch):
        for loss in itertools.chain(self._pg_losses(batch), self._kl_losses(batch)):
            loss.backward()
"""


def test_each_stream_of_a_chain_reaches_the_backward_pass(tmp_path: Path) -> None:
    kl_line = "kl = log_ratio"
    assert findings(tmp_path, CHAINED.format(kl_line=kl_line)) == [(20, "KL001")]


def test_a_score_function_in_a_chained_stream_says_nothing(tmp_path: Path) -> None:
    kl_line = "kl = (log_ratio.detach() * mb['mask']).flip(-1).cumsum(-1).flip(-1) * logps"
    assert findings(tmp_path, CHAINED.format(kl_line=kl_line)) == []


CALLBACKS = """
import torch


class PolicyGradientCallback:
    def on_loss(self, state):
        pg = -(state["advantages"][:, None] * state["logps"] * state["mask"])
        state["loss"] = state["loss"] + pg.sum(-1).mean()


class KLPenaltyCallback:
    def __init__(self, beta=0.05):
        self.beta = beta

    def on_loss(self, state):
        seq_log_ratio = ((state["logps"] - state["ref_logps"]) * state["mask"]).sum(-1)
        kl = 0.5 * seq_log_ratio**2
        state["loss"] = state["loss"] {sign} self.beta * kl.mean()


class Learner:
    def __init__(self, model, beta=0.05):
        self.model = model
        self.callbacks = [PolicyGradientCallback(), KLPenaltyCallback(beta)]

    def learn(self, batch):
        logps = self.model.log_probs(batch["input_ids"])
        state = {{
            "logps": logps,
            "ref_logps": batch["ref_logps"],
            "mask": batch["mask"],
            "advantages": batch["advantages"],
            "loss": 0.0,
        }}
        for callback in self.callbacks:
            callback.on_loss(state)
        state["loss"].backward()
"""


def test_a_callback_that_subtracts_the_penalty_is_reported_inside_it(tmp_path: Path) -> None:
    # The callback returns nothing: it decides what the KL does to the loss
    # it is handed, so the finding is written where it does so.
    assert findings(tmp_path, CALLBACKS.format(sign="-")) == [(17, "KL006")]


def test_a_callback_that_adds_the_penalty_says_nothing(tmp_path: Path) -> None:
    assert findings(tmp_path, CALLBACKS.format(sign="+")) == []


REDUCER_CHOSEN_IN_INIT = """
import functools
from dataclasses import dataclass

import torch


@dataclass
class ActorArgs:
    kl_reduction: str = "{default}"
    kl_coef: float = 0.01


def masked_sum(values, mask, dim=-1):
    return (values * mask).sum(dim=dim)


def masked_sequence_square(values, mask, dim=-1):
    return 0.5 * (values * mask).sum(dim=dim).square()


class PolicyLoss(torch.nn.Module):
    def __init__(self, args):
        super().__init__()
        self.kl_coef = args.kl_coef
        if args.kl_reduction == "token":
            self.kl_reduce = functools.partial(masked_sum, dim=-1)
        elif args.kl_reduction == "sequence":
            self.kl_reduce = functools.partial(masked_sequence_square, dim=-1)
        else:
            raise ValueError(args.kl_reduction)

    def forward(self, log_probs, ref_log_probs, advantages, mask):
        loss = -(advantages[:, None] * log_probs * mask).sum(-1).mean()
        log_ratio = log_probs - ref_log_probs
        kl_loss = self.kl_reduce(log_ratio, mask).mean()
        return loss + self.kl_coef * kl_loss
"""

TRAINER = """
from .loss import PolicyLoss


class Trainer:
    def __init__(self, args, actor):
        self.actor = actor
        self.loss_fn = PolicyLoss(args)

    def step(self, batch):
        log_probs = self.actor(batch["input_ids"])
        loss = self.loss_fn(log_probs, batch["ref_log_probs"], batch["advantages"], batch["mask"])
        loss.backward()
"""


def package_findings(tmp_path: Path, default: str) -> list[tuple[str, int, str]]:
    package = tmp_path / "actor"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "loss.py").write_text(
        textwrap.dedent(REDUCER_CHOSEN_IN_INIT.format(default=default))
    )
    (package / "trainer.py").write_text(textwrap.dedent(TRAINER))
    return [(Path(f.path).name, f.line, f.code) for f in lint_paths([package], jobs=1).findings]


def test_a_reducer_chosen_in_init_by_default_sums_the_k1(tmp_path: Path) -> None:
    # The loss module read in its own file, its ``forward`` with the object
    # the trainer builds: the settings' default takes the ``token`` branch,
    # the log-ratio summed.
    assert package_findings(tmp_path, "token") == [("loss.py", 35, "KL001")]


def test_a_reducer_chosen_in_init_that_squares_the_sum_says_nothing(tmp_path: Path) -> None:
    assert package_findings(tmp_path, "sequence") == []


INDEX_PASSED_DOWN = """
from dataclasses import dataclass
from typing import Literal

import torch


@dataclass
class TrainArgs:
    kl_estimator: Literal[0, 1, 2] = {default}
    kl_coef: float = 0.02


def compute_approx_kl(log_probs, ref_log_probs, mask, kl_type: Literal[0, 1, 2] = 0):
    log_ratio = log_probs - ref_log_probs
    k1 = log_ratio
    k3 = torch.exp(-log_ratio) + log_ratio - 1
    kl_to_go = (log_ratio.detach() * mask).flip(-1).cumsum(-1).flip(-1)
    k1_to_go = log_ratio.detach() + kl_to_go * (log_probs - log_probs.detach())
    return torch.stack([k1, k3, k1_to_go], dim=0)[kl_type]


def policy_loss_function(args, batch, log_probs):
    mask = batch["loss_mask"]
    pg = -(batch["advantages"][:, None] * log_probs * mask).sum(-1).mean()
    kl = compute_approx_kl(log_probs, batch["ref_log_probs"], mask, kl_type=args.kl_estimator)
    loss = pg + args.kl_coef * (kl * mask).sum(-1).mean()
    loss.backward()
"""


def test_an_index_given_by_the_callers_settings_picks_the_estimator(tmp_path: Path) -> None:
    # ``kl_type=args.kl_estimator``: the package's default (1) picks k3.
    assert findings(tmp_path, INDEX_PASSED_DOWN.format(default=1)) == [(26, "KL002")]


def test_an_index_given_by_the_callers_settings_that_picks_the_score_function(
    tmp_path: Path,
) -> None:
    assert findings(tmp_path, INDEX_PASSED_DOWN.format(default=2)) == []


SOFT_REWARD = """
import torch


@torch.no_grad()
def soft_token_rewards(scores, log_probs, ref_log_probs, mask, alpha, kl_coef):
    entropy_bonus = -alpha * log_probs
    log_ratio = log_probs - ref_log_probs
    {kl_line}
    rewards = (entropy_bonus - kl_coef * kl) * mask
    rewards[:, -1] += scores
    return rewards


def train_step(policy, batch, optimizer, alpha=0.01, kl_coef=0.1):
    log_probs = policy.log_probs(batch["input_ids"])
    rewards = soft_token_rewards(
        batch["scores"], log_probs.detach(), batch["ref_log_probs"], batch["mask"], alpha, kl_coef
    )
    returns = rewards.flip(-1).cumsum(-1).flip(-1)
    loss = -(returns * log_probs * batch["mask"]).sum(-1).mean()
    loss.backward()
"""


def test_a_k3_reward_beside_an_entropy_bonus_is_reported(tmp_path: Path) -> None:
    # The bonus -alpha * logp is a term of its own, not part of the KL: the
    # k3 alone is judged, a reward with a biased gradient (KL004).
    kl_line = "kl = torch.exp(-log_ratio) + log_ratio - 1"
    assert findings(tmp_path, SOFT_REWARD.format(kl_line=kl_line)) == [(9, "KL004")]


def test_a_k1_reward_beside_an_entropy_bonus_says_nothing(tmp_path: Path) -> None:
    kl_line = "kl = log_ratio"
    assert findings(tmp_path, SOFT_REWARD.format(kl_line=kl_line)) == []


TWO_REFERENCES = """
import torch


@torch.no_grad()
def token_rewards(old_log_probs, ref_log_probs, prev_ref_log_probs, scores, mask, c1, c2):
    sft_kl = old_log_probs - ref_log_probs
    prev_log_ratio = prev_ref_log_probs - old_log_probs
    {prev_kl_line}
    rewards = -(c1 * sft_kl + c2 * prev_kl) * mask
    rewards[:, -1] += scores
    return rewards


def train_step(policy, batch, c1=0.02, c2=0.08):
    rewards = token_rewards(
        batch["old_log_probs"], batch["ref_log_probs"], batch["prev_ref_log_probs"],
        batch["scores"], batch["mask"], c1, c2,
    )
    returns = rewards.flip(-1).cumsum(-1).flip(-1)
    log_probs = policy.log_probs(batch["input_ids"])
    loss = -(returns * log_probs * batch["mask"]).sum(-1).mean()
    loss.backward()
"""


def test_two_kl_rewards_to_two_references_are_judged_apart(tmp_path: Path) -> None:
    # A k1 reward to one reference and a k3 reward to another: each its own
    # regulariser; the k3 one is biased (KL004), the k1 one is right.
    prev_kl_line = "prev_kl = torch.exp(prev_log_ratio) - prev_log_ratio - 1"
    assert findings(tmp_path, TWO_REFERENCES.format(prev_kl_line=prev_kl_line)) == [(9, "KL004")]


def test_two_k1_rewards_to_two_references_say_nothing(tmp_path: Path) -> None:
    prev_kl_line = "prev_kl = -prev_log_ratio"
    assert findings(tmp_path, TWO_REFERENCES.format(prev_kl_line=prev_kl_line)) == []


BOTH_HALVES_BY_FLAGS = """
from dataclasses import dataclass

import torch


@dataclass
class Config:
    kl_coef: float = 0.05
    kl_in_reward: bool = True
    kl_in_loss: bool = {in_loss}


class Actor:
    def __init__(self, config: Config, model):
        self.config = config
        self.model = model

    def prepare(self, batch):
        if self.config.kl_in_reward:
            with torch.no_grad():
                log_rho = batch["ref_logp"] - batch["old_logp"]
                k3 = (log_rho.exp() - log_rho - 1) * batch["mask"]
                k3_to_go = k3.flip(-1).cumsum(-1).flip(-1)
                batch["advantages"] = batch["advantages"] - self.config.kl_coef * k3_to_go
        return batch

    def train_batch(self, batch):
        batch = self.prepare(batch)
        logp = self.model.log_probs(batch["input_ids"])
        loss = -(batch["advantages"] * logp)
        if self.config.kl_in_loss:
            rho = torch.exp(batch["ref_logp"] - logp)
            loss = loss + self.config.kl_coef * (rho - rho.log() - 1)
        loss = (loss * batch["mask"]).sum(-1).mean()
        loss.backward()
"""


def test_a_k3_reward_whose_k3_loss_is_off_by_default_is_reported(tmp_path: Path) -> None:
    assert findings(tmp_path, BOTH_HALVES_BY_FLAGS.format(in_loss=False)) == [(23, "KL004")]


def test_a_k3_reward_and_k3_loss_both_on_by_default_say_nothing(tmp_path: Path) -> None:
    # The pair is right as the defaults run it; turning the loss half off
    # against its default is not the configuration that trains.
    assert findings(tmp_path, BOTH_HALVES_BY_FLAGS.format(in_loss=True)) == []
