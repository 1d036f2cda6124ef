"""Settings that pick an implementation, and collectives around the KL: a
gradient-carrying ``all_gather`` of a per-token loss, a flag read from a
settings dict the constructor defaults to, a finding on the implementation
the defaults do not run said in the notes of the one they run, a "both"
pairing on the default path, an estimator picked by its name's place in a
list, a value-preserving surrogate whose helper names the reference its
own way, and log-probs handed on through ``*tensors``. Each has its correct
twin, which stays quiet."""

from __future__ import annotations

import textwrap
from pathlib import Path

from kllint.engine import lint_paths
from kllint.findings import Finding


def lint(tmp_path: Path, source: str) -> list[Finding]:
    path = tmp_path / "loss.py"
    path.write_text(textwrap.dedent(source))
    return lint_paths([path], jobs=1).findings


def findings(tmp_path: Path, source: str) -> list[tuple[int, str]]:
    return [(f.line, f.code) for f in lint(tmp_path, source)]


GATHERED = """
import torch
import torch.distributed.nn.functional as dist_nn


def global_masked_sum(values, mask):
    local = (values * mask).sum().reshape(1)
    return torch.cat(dist_nn.all_gather(local)).sum()


def compute_loss(logprobs, ref_logprobs, loss_mask, total_tokens, kl_tau=0.02):
    {kl_line}
    loss = kl_tau * global_masked_sum(kl, loss_mask) / total_tokens
    loss.backward()
"""


def test_a_token_k2_through_a_differentiable_all_gather_is_reported(tmp_path: Path) -> None:
    # ``torch.distributed.nn.functional.all_gather`` keeps each rank's graph.
    kl_line = "kl = 0.5 * (logprobs - ref_logprobs).pow(2)"
    assert findings(tmp_path, GATHERED.format(kl_line=kl_line)) == [(12, "KL003")]


def test_a_kl_to_go_surrogate_through_the_all_gather_says_nothing(tmp_path: Path) -> None:
    kl_line = (
        "kl = (logprobs - ref_logprobs).detach().flip(-1).cumsum(-1).flip(-1)"
        " * (logprobs - logprobs.detach())"
    )
    assert findings(tmp_path, GATHERED.format(kl_line=kl_line)) == []


IMPLEMENTATIONS = """
import torch

DEFAULT_LOSS_CONFIG = {{
    "kl_penalty": 0.01,
    "use_importance_sampling_correction": {default},
}}


def k3(logprobs, ref_logprobs):
    r = ref_logprobs - logprobs
    return torch.exp(r) - r - 1


class PGLossFn:
    def __init__(self, cfg=DEFAULT_LOSS_CONFIG):
        self.kl_penalty = cfg["kl_penalty"]
        self.use_importance_sampling_correction = cfg["use_importance_sampling_correction"]

    def __call__(self, logprobs, old_logprobs, ref_logprobs, mask):
        ratios = (logprobs - old_logprobs).exp()
        if self.use_importance_sampling_correction:
            kl = ratios * k3(logprobs, ref_logprobs)
        else:
            kl = k3(logprobs, ref_logprobs)
        loss = self.kl_penalty * (kl * mask).sum() / mask.sum()
        loss.backward()
"""


def test_the_implementation_the_defaults_run_is_the_finding(tmp_path: Path) -> None:
    # Both implementations are wrong; the one a run takes by default is
    # reported, the other named in its notes.
    found = lint(tmp_path, IMPLEMENTATIONS.format(default="True"))
    assert [(f.line, f.code) for f in found] == [(23, "KL003")]
    assert any("KL002" in note and "(line 25)" in note for note in found[0].notes)


def test_the_other_default_reports_the_other_implementation(tmp_path: Path) -> None:
    found = lint(tmp_path, IMPLEMENTATIONS.format(default="False"))
    assert [(f.line, f.code) for f in found] == [(25, "KL002")]


BOTH_BY_DEFAULT = """
import torch

DEFAULT_LOSS_CONFIG = {{
    "kl_penalty": 0.01,
    "use_importance_sampling_correction": False,
}}


def k3(logprobs, ref_logprobs):
    r = ref_logprobs - logprobs
    return torch.exp(r) - r - 1


class PGLossFn:
    def __init__(self, cfg=DEFAULT_LOSS_CONFIG):
        self.kl_penalty = cfg["kl_penalty"]
        self.use_importance_sampling_correction = cfg["use_importance_sampling_correction"]

    def __call__(self, logprobs, old_logprobs, ref_logprobs, advantages, mask):
        ratios = (logprobs - old_logprobs).exp()
        kl_per_token = k3(logprobs, ref_logprobs)
        if self.use_importance_sampling_correction:
            kl_per_token = ratios * kl_per_token
        with torch.no_grad():
            kl_rewards = -self.kl_penalty * k3(logprobs, ref_logprobs) * mask
            advantages = advantages + kl_rewards.flip(-1).cumsum(-1).flip(-1)
        pg_loss = -(advantages * ratios * mask).sum() / mask.sum()
        {kl_loss_line}
        loss = pg_loss + kl_loss
        loss.backward()
"""


def test_a_k3_reward_and_k3_loss_by_default_say_nothing(tmp_path: Path) -> None:
    # "Both": the default path is right, so the importance-weighted k3 that
    # only a non-default setting turns on is not reported either.
    kl_loss_line = "kl_loss = self.kl_penalty * (kl_per_token * mask).sum() / mask.sum()"
    assert findings(tmp_path, BOTH_BY_DEFAULT.format(kl_loss_line=kl_loss_line)) == []


def test_a_k3_reward_with_a_halved_k3_loss_is_reported(tmp_path: Path) -> None:
    kl_loss_line = "kl_loss = 0.5 * self.kl_penalty * (kl_per_token * mask).sum() / mask.sum()"
    assert findings(tmp_path, BOTH_BY_DEFAULT.format(kl_loss_line=kl_loss_line)) != []


STACKED = """
from dataclasses import dataclass
from typing import Literal

import torch

KL_ESTIMATORS = ["kl1", "kl2", "kl3"]


@dataclass
class Args:
    beta: float = 0.05
    kl_estimator: Literal["kl1", "kl2", "kl3"] = "{default}"


class Learner:
    def __init__(self, args: Args):
        self.args = args

    def loss(self, new_logprobs, ref_logprobs, mask):
        diff = new_logprobs - ref_logprobs
        kl_stack = torch.stack([diff, diff.square() / 2, torch.expm1(-diff) + diff])
        kl = kl_stack[KL_ESTIMATORS.index(self.args.kl_estimator)]
        loss = (self.args.beta * kl * mask).sum(-1).mean()
        loss.backward()
"""


def test_an_estimator_picked_by_its_place_in_a_list_is_judged(tmp_path: Path) -> None:
    # ``KL_ESTIMATORS.index(args.kl_estimator)`` with the default "kl1": the
    # first row, a k1 differentiated as a loss.
    assert findings(tmp_path, STACKED.format(default="kl1")) == [(21, "KL001")]


def test_the_other_rows_are_not_reported_for_it(tmp_path: Path) -> None:
    assert findings(tmp_path, STACKED.format(default="kl3")) == [(22, "KL002")]


VALUE_AND_SCORE = """
import torch


def kl_penalty(logprob, ref_logprob):
    if logprob.dtype in (torch.float16, torch.bfloat16):
        logprob, ref_logprob = logprob.float(), ref_logprob.float()
    x = torch.clamp(ref_logprob - logprob, min=-20.0, max=20.0)
    return torch.expm1(x) - x


def compute_loss(log_prob, ref_log_prob, response_mask, kl_coef=0.001):
    kld = kl_penalty(log_prob, ref_log_prob)
    with torch.no_grad():
        log_ratio = (log_prob - ref_log_prob) * response_mask
        kl_to_go = log_ratio.flip(-1).cumsum(-1).flip(-1)
    {kl_line}
    loss = kl_coef * (kld * response_mask).sum(-1).mean()
    loss.backward()
"""


def test_a_k3_value_with_the_kl_to_go_s_gradient_says_nothing(tmp_path: Path) -> None:
    # The helper calls the reference ``ref_logprob``, the caller
    # ``ref_log_prob``: one reference, one KL's value and its gradient.
    kl_line = "kld = kld.detach() + kl_to_go * (log_prob - log_prob.detach())"
    assert findings(tmp_path, VALUE_AND_SCORE.format(kl_line=kl_line)) == []


def test_a_k3_value_with_the_token_s_own_score_is_reported(tmp_path: Path) -> None:
    kl_line = "kld = kld.detach() + log_ratio * (log_prob - log_prob.detach())"
    assert findings(tmp_path, VALUE_AND_SCORE.format(kl_line=kl_line)) == [(17, "KL003")]


LEVELS = """
from dataclasses import dataclass

import torch


@dataclass
class ActorConfig:
    use_kl_loss: bool = True
    kl_loss_coef: float = 0.001
    kl_loss_level: str = "{level}"


class Actor:
    def __init__(self, config: ActorConfig):
        self.config = config

    def policy_loss(self, log_prob, ref_log_prob, response_mask):
        cfg = self.config
        kl_loss = 0.0
        if cfg.use_kl_loss and cfg.kl_loss_level == "trajectory":
            log_ratio = ((log_prob - ref_log_prob) * response_mask).sum(-1)
            kl_loss = (0.5 * log_ratio.square()).mean()
        elif cfg.use_kl_loss:
            kld = 0.5 * (log_prob - ref_log_prob).square()
            kl_loss = (kld * response_mask).sum(-1).mean()
        loss = cfg.kl_loss_coef * kl_loss
        loss.backward()
"""


def test_the_level_a_run_takes_by_default_decides_the_elif(tmp_path: Path) -> None:
    # ``use_kl_loss and kl_loss_level == "trajectory"`` is ``use_kl_loss`` by
    # default: the ``elif use_kl_loss`` after it is not run unless the
    # level is changed.
    assert findings(tmp_path, LEVELS.format(level="trajectory")) == []


def test_the_token_level_by_default_is_reported(tmp_path: Path) -> None:
    assert findings(tmp_path, LEVELS.format(level="token")) == [(25, "KL003")]


FORWARDED = """
import torch


def loss_terms(log_probs, ref_log_probs, mask, *, beta=0.05):
    log_ratio = log_probs - ref_log_probs
    {kl_line}
    return beta * kl


def actor_loss(*tensors, **kwargs):
    return loss_terms(*tensors, **kwargs)


def training_step(actor, batch):
    log_probs = actor(batch["input_ids"])
    loss = actor_loss(log_probs, batch["ref_log_probs"], batch["mask"], beta=0.1)
    loss.backward()
"""


def test_a_token_k2_behind_a_varargs_forwarder_is_reported(tmp_path: Path) -> None:
    # ``actor_loss(*tensors)`` hands its positionals on as they were given.
    kl_line = "kl = (0.5 * log_ratio.square() * mask).sum(-1).mean()"
    assert findings(tmp_path, FORWARDED.format(kl_line=kl_line)) == [(7, "KL003")]


def test_a_sequence_k2_behind_it_says_nothing(tmp_path: Path) -> None:
    kl_line = "kl = (0.5 * (log_ratio * mask).sum(-1).square()).mean()"
    assert findings(tmp_path, FORWARDED.format(kl_line=kl_line)) == []
