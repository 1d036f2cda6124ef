"""KL terms carried by records and weighed by flags: a TensorDict's nested
keys, a record extended with ``|``, a dataclass copied with
``dataclasses.replace``, loss terms returned as (weight, loss) pairs, an
NLL on demonstrations beside the KL, and an importance weight chosen by a
flag whose default the settings give. Each has its correct twin, which
stays quiet."""

from __future__ import annotations

import textwrap
from pathlib import Path

from kllint.engine import lint_paths


def findings(tmp_path: Path, source: str) -> list[tuple[int, str]]:
    path = tmp_path / "loss.py"
    path.write_text(textwrap.dedent(source))
    return [(f.line, f.code) for f in lint_paths([path], jobs=1).findings]


NESTED_KEYS = """
import torch


class Distiller:
    def __init__(self, student, teacher, optimizer):
        self.student = student
        self.teacher = teacher
        self.optimizer = optimizer

    def _distill_kl(self, td):
        student = td["student", "logps"]
        teacher = td["teacher", "logps"]
        {kl_line}

    def train_step(self, td):
        with torch.no_grad():
            td["teacher", "logps"] = self.teacher.log_probs(td["input_ids"])
        td["student", "logps"] = self.student.log_probs(td["input_ids"])
        loss = self._distill_kl(td).mean()
        loss.backward()
"""


def test_a_k1_between_nested_keys_of_a_tensordict_is_reported(tmp_path: Path) -> None:
    # ``td["teacher", "logps"]`` names the teacher's log-probs, the reference.
    kl_line = 'return ((student - teacher) * td["mask"]).sum(-1)'
    assert findings(tmp_path, NESTED_KEYS.format(kl_line=kl_line)) == [(14, "KL001")]


def test_a_sequence_k2_between_nested_keys_says_nothing(tmp_path: Path) -> None:
    kl_line = 'return 0.5 * ((student - teacher) * td["mask"]).sum(-1) ** 2'
    assert findings(tmp_path, NESTED_KEYS.format(kl_line=kl_line)) == []


MERGED_RECORD = """
import torch


class Trainer:
    def __init__(self, policy, kl_coef=0.05):
        self.policy = policy
        self.kl_coef = kl_coef

    @torch.no_grad()
    def _add_kl(self, rollout):
        return rollout | {{"kl": {kl}}}

    @torch.no_grad()
    def _returns(self, rollout):
        rewards = -self.kl_coef * rollout["kl"] * rollout["mask"]
        rewards[:, -1] += rollout["scores"]
        return {{**rollout, "returns": rewards.flip(1).cumsum(1).flip(1)}}

    def train_step(self, rollout):
        rollout = self._returns(self._add_kl(rollout))
        logprobs = self.policy.log_probs(rollout["input_ids"])
        loss = -(rollout["returns"] * logprobs * rollout["mask"]).sum(1).mean()
        loss.backward()
"""


def test_a_negated_log_ratio_merged_into_a_record_is_reported(tmp_path: Path) -> None:
    # ``ref - logp`` as the KL, then ``-coef * kl`` in the rewards: a bonus.
    kl = 'rollout["ref_logprobs"] - rollout["logprobs"]'
    assert findings(tmp_path, MERGED_RECORD.format(kl=kl)) == [(12, "KL006")]


def test_a_log_ratio_merged_into_a_record_says_nothing(tmp_path: Path) -> None:
    kl = 'rollout["logprobs"] - rollout["ref_logprobs"]'
    assert findings(tmp_path, MERGED_RECORD.format(kl=kl)) == []


REPLACED_RECORD = """
import dataclasses
from dataclasses import dataclass, field

import torch


@dataclass
class LossOutput:
    loss: torch.Tensor
    metrics: dict = field(default_factory=dict)


def grpo_loss(new_logprobs, batch, beta=0.05):
    mask = batch["mask"]
    pg_loss = -(batch["advantages"][:, None] * new_logprobs * mask).sum(-1).mean()
    out = LossOutput(loss=pg_loss, metrics={{}})
    seq_log_ratio = ((new_logprobs - batch["ref_logprobs"]) * mask).sum(-1)
    kl = (0.5 * seq_log_ratio.square()).mean(){item}
    out.metrics["kl"] = kl
    return dataclasses.replace(out, loss=out.loss + beta * out.metrics["kl"])


def train_step(policy, batch):
    out = grpo_loss(policy.log_probs(batch["input_ids"]), batch)
    out.loss.backward()
"""


def test_a_kl_turned_into_a_float_before_it_is_added_is_reported(tmp_path: Path) -> None:
    assert findings(tmp_path, REPLACED_RECORD.format(item=".item()")) == [(19, "KL005")]


def test_a_kl_kept_as_a_tensor_through_the_record_says_nothing(tmp_path: Path) -> None:
    assert findings(tmp_path, REPLACED_RECORD.format(item="")) == []


WEIGHTED_PAIRS = """
import torch


class Learner:
    def __init__(self, model, beta=0.05):
        self.model = model
        self.beta = beta

    def named_losses(self, logprobs, ref_logprobs, advantages, mask):
        pg_loss = -(advantages[:, None] * logprobs * mask).sum(-1).mean()
        log_ratio = (logprobs - ref_logprobs){detach}
        seq_log_ratio = (log_ratio * mask).sum(-1)
        kl = 0.5 * seq_log_ratio.square()
        return {{"pg": (1.0, pg_loss), "kl": (self.beta, kl.mean())}}

    def learning_step(self, batch):
        logprobs = self.model.log_probs(batch["input_ids"])
        terms = self.named_losses(logprobs, batch["ref_logprobs"], batch["advantages"], batch["mask"])
        loss = sum(coef * value for coef, value in terms.values())
        loss.backward()
"""


def test_a_detached_kl_among_weighted_loss_terms_is_reported_inside(tmp_path: Path) -> None:
    # The helper returns the KL beside a loss with the policy's gradient: it
    # detached the log-ratio itself, whatever it was given (KL005, inside).
    assert findings(tmp_path, WEIGHTED_PAIRS.format(detach=".detach()")) == [(14, "KL005")]


def test_a_sequence_k2_among_weighted_loss_terms_says_nothing(tmp_path: Path) -> None:
    assert findings(tmp_path, WEIGHTED_PAIRS.format(detach="")) == []


DEMONSTRATIONS = """
import torch


def actor_losses(log_probs, ref_log_probs, advantages, mask, ptx_log_probs, ptx_sft_log_probs,
                 ptx_mask, kl_coef=0.02, ptx_coef=0.1):
    pg_loss = -(advantages[:, None] * log_probs * mask).sum(-1).mean()
    {kl_line}
    kl_loss = kl_coef * (per_token_kl * mask).sum(-1).mean()
    ptx_nll = (ptx_sft_log_probs - ptx_log_probs) * ptx_mask
    ptx_loss = ptx_coef * ptx_nll.sum(-1).mean()
    return pg_loss + kl_loss + ptx_loss


def train_step(actor, exp, ptx_batch):
    log_probs = actor.log_probs(exp["input_ids"])
    ptx_log_probs = actor.log_probs(ptx_batch["input_ids"])
    loss = actor_losses(log_probs, exp["ref_logprobs"], exp["advantages"], exp["mask"],
                        ptx_log_probs, ptx_batch["sft_logprobs"], ptx_batch["mask"])
    loss.backward()
"""


def test_only_the_kl_of_the_policys_own_samples_is_reported(tmp_path: Path) -> None:
    # The pretraining-mix NLL, written against the SFT model, is on data the
    # policy did not sample: no KL estimate.
    kl_line = "per_token_kl = log_probs - ref_log_probs"
    assert findings(tmp_path, DEMONSTRATIONS.format(kl_line=kl_line)) == [(8, "KL001")]


def test_an_nll_on_demonstrations_beside_a_right_kl_says_nothing(tmp_path: Path) -> None:
    kl_line = (
        "per_token_kl = (log_probs - ref_log_probs).detach().flip(-1).cumsum(-1).flip(-1)"
        " * log_probs"
    )
    assert findings(tmp_path, DEMONSTRATIONS.format(kl_line=kl_line)) == []


IMPORTANCE_FLAG = """
import torch

DEFAULT_LOSS_CONFIG = {{"kl_penalty": 0.01, "use_importance_sampling_correction": {use_is}}}


class ClippedPGLossFn:
    def __init__(self, cfg):
        self.kl_coef = cfg["kl_penalty"]
        self.use_is = cfg["use_importance_sampling_correction"]

    def __call__(self, curr_logprobs, data):
        mask = data["token_mask"]
        ratio = torch.exp(curr_logprobs - data["prev_logprobs"])
        loss = -(torch.min(ratio * data["advantages"], ratio.clamp(0.8, 1.2) * data["advantages"]) * mask).sum()
        log_r = data["reference_policy_logprobs"] - curr_logprobs
        k3 = torch.exp(log_r) - log_r - 1
        weight = ratio if self.use_is else torch.ones_like(ratio)
        kl = weight * k3
        return loss + self.kl_coef * (kl * mask).sum()


def train_step(policy, batch, loss_config=None):
    loss_fn = ClippedPGLossFn(loss_config or DEFAULT_LOSS_CONFIG)
    loss = loss_fn(policy.log_probs(batch["input_ids"]), batch)
    loss.backward()
"""


def test_the_importance_weight_a_flag_turns_on_by_default_decides_the_finding(
    tmp_path: Path,
) -> None:
    # On by default, ``ratio * k3`` adds the k3 reward's half to the loss's:
    # the token-level gradient of KL(pi||pi_ref) (KL003), where the k3 is weighed.
    assert findings(tmp_path, IMPORTANCE_FLAG.format(use_is=True)) == [(19, "KL003")]


def test_without_the_importance_weight_by_default_the_k3_is_reported(tmp_path: Path) -> None:
    assert findings(tmp_path, IMPORTANCE_FLAG.format(use_is=False)) == [(17, "KL002")]


AS_TENSOR = """
import torch


def kl_loss(log_probs, ref_log_probs, mask, coef=0.05):
    log_probs = torch.as_tensor(log_probs, device="cpu")
    ref = torch.as_tensor(ref_log_probs, dtype=log_probs.dtype)
    {kl_line}
    return coef * kl.mean()


def step(model, batch):
    kl_loss(model.log_probs(batch["ids"]), batch["ref_log_probs"], batch["mask"]).backward()
"""


def test_a_k3_through_as_tensor_keeps_its_gradient(tmp_path: Path) -> None:
    # ``torch.as_tensor`` of a tensor is that tensor, graph and all: the k3
    # is differentiated (KL002), not a constant (KL005).
    kl_line = "kl = ((torch.exp(ref - log_probs) - (ref - log_probs) - 1) * mask).sum(-1)"
    assert findings(tmp_path, AS_TENSOR.format(kl_line=kl_line)) == [(8, "KL002")]


def test_a_sequence_k2_through_as_tensor_says_nothing(tmp_path: Path) -> None:
    kl_line = "kl = 0.5 * ((log_probs - ref) * mask).sum(-1) ** 2"
    assert findings(tmp_path, AS_TENSOR.format(kl_line=kl_line)) == []


EXPERIENCE_AND_INFO = """
import torch


class Trainer:
    def __init__(self, actor, kl_coef=0.05):
        self.actor = actor
        self.kl_coef = kl_coef

    @torch.no_grad()
    def make_experience(self, batch):
        log_probs = self.actor(batch["input_ids"])
        ref_log_probs = batch["ref_log_probs"]
        {kl_line}
        rewards = -self.kl_coef * kl * batch["mask"]
        returns = rewards.flip(-1).cumsum(-1).flip(-1)
        info = {{"kl": kl.mean().item()}}
        return {{"log_probs": log_probs, "advantages": returns, "mask": batch["mask"]}}, info

    def training_step(self, experience, batch):
        log_probs = self.actor(batch["input_ids"])
        ratio = torch.exp(log_probs - experience["log_probs"])
        loss = -(ratio * experience["advantages"] * experience["mask"]).sum(-1).mean()
        loss.backward()
"""


def test_advantages_returned_beside_the_metrics_are_judged(tmp_path: Path) -> None:
    # ``return experience, info``: the experience dict is read back by the
    # loss as much as a dict returned alone is. A reversed log-ratio makes
    # the KL penalty a bonus.
    kl_line = "kl = ref_log_probs - log_probs"
    assert findings(tmp_path, EXPERIENCE_AND_INFO.format(kl_line=kl_line)) == [(14, "KL006")]


def test_the_penalty_with_its_sign_returned_beside_the_metrics_says_nothing(
    tmp_path: Path,
) -> None:
    kl_line = "kl = log_probs - ref_log_probs"
    assert findings(tmp_path, EXPERIENCE_AND_INFO.format(kl_line=kl_line)) == []
