"""Names that lead to the estimator: a registry of classes keyed by a
constant of each class, a module alias of a function that a parameter of
the caller shadows, a teacher's logits handed to a helper's ``logits``, a
cross-entropy against probabilities, and the total read off the end of a
running sum. Each has its correct twin, which stays quiet."""

from __future__ import annotations

import textwrap
from pathlib import Path

from kllint.engine import lint_paths


def findings(tmp_path: Path, source: str) -> list[tuple[int, str]]:
    path = tmp_path / "loss.py"
    path.write_text(textwrap.dedent(source))
    return [(f.line, f.code) for f in lint_paths([path], jobs=1).findings]


CLASS_REGISTRY = """
import abc
from dataclasses import dataclass

import torch


class KLEstimator(abc.ABC):
    name: str = "base"

    @abc.abstractmethod
    def kl(self, logp, ref):
        ...


class K1(KLEstimator):
    name = "k1"

    def kl(self, logp, ref):
        return logp - ref


class K2(KLEstimator):
    name = "k2"

    def kl(self, logp, ref):
        return 0.5 * (logp - ref) ** 2


ESTIMATORS = {{cls.name: cls for cls in (K1, K2)}}


@dataclass
class Config:
    beta: float = 0.04
    kl_type: str = "{default}"


class Trainer:
    def __init__(self, model, args=None):
        self.model = model
        self.args = args or Config()
        self.kl_estimator = ESTIMATORS[self.args.kl_type]()

    def loss(self, logps, ref_logps, advantages, mask):
        per_token = -advantages[:, None] * logps
        per_token_kl = self.kl_estimator.kl(logps, ref_logps)
        per_token = per_token + self.args.beta * per_token_kl
        return (per_token * mask).sum(-1).mean()

    def step(self, batch):
        loss = self.loss(self.model.log_probs(batch["ids"]), batch["ref_logps"], batch["adv"], batch["mask"])
        loss.backward()
"""


def test_a_class_picked_from_a_registry_keyed_by_class_constants(tmp_path: Path) -> None:
    # ``{cls.name: cls for cls in (K1, K2)}``: the default "k1" picks K1.
    assert findings(tmp_path, CLASS_REGISTRY.format(default="k1")) == [(47, "KL001")]


def test_the_registry_default_that_picks_k2_gives_the_token_level_finding(
    tmp_path: Path,
) -> None:
    # A per-token k2 summed over tokens: the token-level part only (KL003),
    # not the k1's zero gradient.
    assert findings(tmp_path, CLASS_REGISTRY.format(default="k2")) == [(47, "KL003")]


SHADOWED_ALIAS = """
import torch


def kl_penalty(logprob, ref_logprob, kl_penalty="kl"):
    if kl_penalty == "kl":
        return logprob - ref_logprob
    if kl_penalty == "low_var_kl":
        kl = ref_logprob - logprob
        return torch.exp(kl) - kl - 1
    raise NotImplementedError(kl_penalty)


def apply_kl_penalty(data, kl_coef, kl_penalty="kl"):
    with torch.no_grad():
        kld = kl_penalty_fn(data["old_log_probs"], data["ref_log_prob"], kl_penalty=kl_penalty)
    data["token_level_rewards"] = data["token_level_scores"] - kl_coef * kld * data["mask"]
    return data


kl_penalty_fn = kl_penalty


class Trainer:
    def fit(self, batch, kl_coef=0.001):
        batch = apply_kl_penalty(batch, kl_coef, kl_penalty="{estimator}")
        returns = batch["token_level_rewards"].flip(-1).cumsum(-1).flip(-1)
        batch["advantages"] = returns * batch["mask"]
        return batch
"""


def test_an_alias_is_read_in_its_module_not_where_a_parameter_shadows_it(
    tmp_path: Path,
) -> None:
    # ``kl_penalty_fn = kl_penalty`` is the function, although the caller's
    # parameter is also called ``kl_penalty``: the literal picks k3 (KL004).
    assert findings(tmp_path, SHADOWED_ALIAS.format(estimator="low_var_kl")) == [(26, "KL004")]


def test_the_aliased_helper_with_a_k1_reward_says_nothing(tmp_path: Path) -> None:
    assert findings(tmp_path, SHADOWED_ALIAS.format(estimator="kl")) == []


TEACHER_NLL = """
import torch
import torch.nn.functional as F


def token_nll(logits, ids):
    bsz, seqlen, vocab = logits.shape
    nll = F.cross_entropy(logits.reshape(-1, vocab).float(), ids.reshape(-1), reduction="none")
    return nll.view(bsz, seqlen)


class Distiller:
    def __init__(self, model, {other}_model):
        self.model = model
        self.{other}_model = {other}_model

    def kl_loss(self, batch):
        ids = batch["completion_ids"]
        logits = self.model(batch["input_ids"]).logits
        with torch.no_grad():
            {other}_logits = self.{other}_model(batch["input_ids"]).logits
        student_nll = token_nll(logits, ids)
        with torch.no_grad():
            other_nll = token_nll({other}_logits, ids)
        per_token = {difference}
        return (per_token * batch["mask"]).sum(-1).mean()

    def step(self, batch):
        self.kl_loss(batch).backward()
"""


def test_the_k1_of_a_reference_written_with_nlls_is_reported(tmp_path: Path) -> None:
    # ``ref_nll - student_nll`` is ``logp - ref_lp``: the k1, minimised.
    source = TEACHER_NLL.format(other="ref", difference="other_nll - student_nll")
    assert findings(tmp_path, source) == [(25, "KL001")]


def test_the_nll_difference_against_a_teacher_is_its_likelihood(tmp_path: Path) -> None:
    # The teacher's logits, handed to the helper's ``logits``, are still the
    # teacher's: ``teacher_lp - student_lp`` minimised, sequence-level
    # distillation on the teacher's samples.
    source = TEACHER_NLL.format(other="teacher", difference="student_nll - other_nll")
    assert findings(tmp_path, source) == []


SOFT_TARGETS = """
import torch
import torch.nn.functional as F


def distill_loss(logits, ref_logits, ids, mask):
    logps = torch.gather(logits.log_softmax(-1), -1, ids.unsqueeze(-1)).squeeze(-1)
    probs = logits.softmax(-1)
    ce = F.cross_entropy(ref_logits.transpose(1, 2), {target}, reduction="none")
    return ((ce + logps) * mask).sum(-1).mean()


def step(model, ref_model, batch):
    logits = model(batch["ids"]).logits
    with torch.no_grad():
        ref_logits = ref_model(batch["ids"]).logits
    distill_loss(logits, ref_logits, batch["ids"], batch["mask"]).backward()
"""


def test_a_cross_entropy_of_the_sampled_tokens_minus_the_policys_is_a_k1(
    tmp_path: Path,
) -> None:
    # ``-log q(y) + log p(y)``: the sampled token's k1, minimised.
    assert findings(tmp_path, SOFT_TARGETS.format(target="ids")) == [(10, "KL001")]


def test_a_cross_entropy_against_probabilities_is_not_a_sampled_token_nll(
    tmp_path: Path,
) -> None:
    # With probabilities as the target it is ``-sum_v p_v log q_v`` over the
    # vocabulary, not ``-log q(y)``: no k1 is claimed.
    assert findings(tmp_path, SOFT_TARGETS.format(target="probs.transpose(1, 2)")) == []


SUFFIX_SUM = """
import torch


def kl_loss(logps, ref_logps, mask, beta=0.04):
    with torch.no_grad():
        log_ratio = (logps - ref_logps) * mask
        running = log_ratio.cumsum(dim=1)
        kl_to_go = {to_go}
    per_token_kl = kl_to_go * logps
    return beta * (per_token_kl * mask).sum(dim=1).mean()


def step(model, batch):
    logps = model.log_probs(batch["ids"])
    kl_loss(logps, batch["ref_logps"], batch["mask"]).backward()
"""


def test_a_running_sum_that_stops_at_each_token_is_a_prefix_weight(tmp_path: Path) -> None:
    # ``running`` alone weighs each token by the KL before it, not after.
    assert findings(tmp_path, SUFFIX_SUM.format(to_go="running")) == [(10, "KL003")]


def test_the_total_minus_the_running_sum_is_the_kl_still_to_come(tmp_path: Path) -> None:
    # ``running[:, -1:]`` is each sequence's total: ``total - running + x``
    # is the reward-to-go, the sequence KL's score function.
    to_go = "running[:, -1:] - running + log_ratio"
    assert findings(tmp_path, SUFFIX_SUM.format(to_go=to_go)) == []


CLI_OPTION = """
import torch
import typer


@torch.no_grad()
def token_rewards(logprobs, ref_logprobs, scores, mask, kl_coef, kl_estimator):
    log_ratio = logprobs - ref_logprobs
    if kl_estimator == "k1":
        kl = log_ratio
    else:
        kl = torch.exp(-log_ratio) + log_ratio - 1
    rewards = -kl_coef * kl * mask
    rewards[:, -1] += scores
    return rewards


def train(model, batch, kl_coef: float = typer.Option(0.02), kl_estimator: str = typer.Option("{default}")):
    logprobs = model.log_probs(batch["input_ids"])
    rewards = token_rewards(logprobs.detach(), batch["ref_logprobs"], batch["scores"], batch["mask"], kl_coef, kl_estimator)
    returns = rewards.flip(-1).cumsum(-1).flip(-1)
    loss = -(returns * logprobs * batch["mask"]).sum(-1).mean()
    loss.backward()
"""


def test_a_typer_option_default_that_picks_k3_gives_the_k3_reward(tmp_path: Path) -> None:
    assert findings(tmp_path, CLI_OPTION.format(default="k3")) == [(12, "KL004")]


def test_a_typer_option_default_that_picks_k1_says_nothing(tmp_path: Path) -> None:
    assert findings(tmp_path, CLI_OPTION.format(default="k1")) == []


def write_package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def package_findings(root: Path) -> list[tuple[str, int, str]]:
    return [(Path(f.path).name, f.line, f.code) for f in lint_paths([root], jobs=1).findings]


KL_UTILS = """
import torch

__all__ = ["log_ratio", "approx_kl"]


def log_ratio(logps, ref_logps):
    return logps - ref_logps


def approx_kl(logps, ref_logps):
    delta = ref_logps - logps
    return torch.exp(delta) - delta - 1
"""

STAR_TRAINER = """
import torch

from ..utils import *  # noqa: F403


class GRPOTrainer:
    def __init__(self, beta=0.04):
        self.beta = beta

    def compute_loss(self, logps, inputs):
        mask = inputs["completion_mask"]
        per_token_loss = -inputs["advantages"][:, None] * logps
        per_token_kl = {estimate}
        per_token_loss = per_token_loss + self.beta * per_token_kl
        return (per_token_loss * mask).sum(-1).mean()

    def training_step(self, model, inputs):
        self.compute_loss(model.log_probs(inputs["ids"]), inputs).backward()
"""


def test_a_helper_re_exported_by_two_star_imports_is_followed(tmp_path: Path) -> None:
    # ``from ..utils import *``, where ``utils/__init__.py`` has ``from .kl
    # import *``: ``approx_kl`` is the k3 of ``utils/kl.py``.
    root = write_package(
        tmp_path / "grpo",
        {
            "__init__.py": "",
            "utils/__init__.py": "from .kl import *  # noqa: F403\n",
            "utils/kl.py": KL_UTILS,
            "trainer/__init__.py": "",
            "trainer/grpo.py": STAR_TRAINER.format(
                estimate='approx_kl(logps, inputs["ref_logps"])'
            ),
        },
    )
    assert package_findings(root) == [("grpo.py", 14, "KL002")]


def test_a_re_exported_helper_used_as_a_reward_to_go_says_nothing(tmp_path: Path) -> None:
    estimate = 'log_ratio(logps, inputs["ref_logps"]).detach().flip(-1).cumsum(-1).flip(-1) * logps'
    root = write_package(
        tmp_path / "grpo",
        {
            "__init__.py": "",
            "utils/__init__.py": "from .kl import *  # noqa: F403\n",
            "utils/kl.py": KL_UTILS,
            "trainer/__init__.py": "",
            "trainer/grpo.py": STAR_TRAINER.format(estimate=estimate),
        },
    )
    assert package_findings(root) == []


NAMESPACE_DEFAULTS = """
from argparse import Namespace


def default_args():
    return Namespace(kl_loss_coef=0.02, kl_loss_type="{default}")
"""

PPO_UTILS = """
import torch


def compute_approx_kl(log_probs, ref_log_probs, kl_loss_type):
    log_ratio = log_probs - ref_log_probs
    if kl_loss_type == "k2":
        return 0.5 * log_ratio**2
    if kl_loss_type == "seq_k2":
        return 0.5 * log_ratio.sum(-1, keepdim=True) ** 2 / log_ratio.shape[-1]
    raise ValueError(kl_loss_type)
"""

BACKEND_LOSS = """
from ..utils.ppo_utils import compute_approx_kl as compute_kl


def policy_loss_function(args, batch, log_probs):
    mask = batch["loss_masks"]
    loss = -(batch["advantages"][:, None] * log_probs * mask).sum(-1).mean()
    kl = compute_kl(log_probs, batch["ref_log_probs"], kl_loss_type=args.kl_loss_type)
    loss = loss + args.kl_loss_coef * (kl * mask).sum(-1).mean()
    loss.backward()
"""


def namespace_package(root: Path, default: str) -> Path:
    # ``backends/`` has no ``__init__.py``: a namespace directory of the
    # package, whose module imports from the package above it.
    return write_package(
        root,
        {
            "__init__.py": NAMESPACE_DEFAULTS.format(default=default),
            "utils/__init__.py": "",
            "utils/ppo_utils.py": PPO_UTILS,
            "backends/loss.py": BACKEND_LOSS,
        },
    )


def test_settings_of_the_package_reach_a_module_of_a_namespace_directory(
    tmp_path: Path,
) -> None:
    # The package's ``Namespace(kl_loss_type="k2")`` is the default the
    # loss in ``backends/`` reads: the per-token k2, summed (KL003).
    root = namespace_package(tmp_path / "slime_like", "k2")
    assert package_findings(root) == [("loss.py", 8, "KL003")]


def test_the_package_default_of_the_sequence_k2_says_nothing(tmp_path: Path) -> None:
    root = namespace_package(tmp_path / "slime_like", "seq_k2")
    assert package_findings(root) == []
