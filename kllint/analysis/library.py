"""KL estimators of RL libraries that a project imports without shipping.

A trainer built on verl calls ``verl.trainer.ppo.core_algos.kl_penalty``
with the estimator's name; when verl is not part of the linted tree, the
call would be unknown and the KL term lost. Each entry here is a stand-in
written for kllint, with the library function's signature and the
estimator each option computes (value and gradient), so the call is
followed as a helper of another module is: the verdict is placed at the
call. Only functions whose behaviour has not changed across the releases
kllint is checked on are listed.
"""

from __future__ import annotations

from pathlib import Path

import libcst as cst

from kllint.analysis.module import ModuleInfo, unparsed
from kllint.analysis.values import FuncRef

# verl 0.4-0.9: ``kl_penalty(logprob, ref_logprob, kl_penalty)``. A ``+``
# suffix (0.7+) keeps the named estimator's value and takes the gradient of
# k2 by a straight-through term; k3 is clamped for numerical stability.
_VERL_CORE_ALGOS = """
import torch


def kl_penalty(logprob, ref_logprob, kl_penalty):
    if kl_penalty in ("kl+", "k1+", "abs+", "low_var_kl+", "k3+"):
        value = kl_penalty_forward(logprob, ref_logprob, kl_penalty[:-1])
        k2 = 0.5 * (logprob - ref_logprob).square()
        return k2 - k2.detach() + value.detach()
    return kl_penalty_forward(logprob, ref_logprob, kl_penalty)


def kl_penalty_forward(logprob, ref_logprob, kl_penalty):
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty == "abs":
        return (logprob - ref_logprob).abs()
    if kl_penalty in ("mse", "k2", "mse+", "k2+"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        kl = torch.clamp(ref_logprob - logprob, min=-20, max=20)
        ratio = torch.exp(kl)
        return torch.clamp(ratio - kl - 1, min=-10, max=10)
    raise NotImplementedError(kl_penalty)
"""

# OpenRLHF 0.5-0.11: ``compute_approx_kl(log_probs, log_probs_base, ...,
# kl_estimator="k1")``. The third positional parameter was the action mask
# before 0.9 and the rollout's log-probs after; neither changes the estimator.
# ``unbiased_gradient=True`` (0.10+) keeps the value and takes the gradient of
# the detached k1 times the log-probs, by a straight-through term.
_OPENRLHF_MODEL_UTILS = """
import torch


def compute_approx_kl(
    log_probs,
    log_probs_base,
    third=None,
    kl_estimator="k1",
    unbiased_gradient=False,
    action_mask=None,
    log_probs_old=None,
):
    log_ratio = log_probs.float() - log_probs_base.float()
    if kl_estimator == "k1":
        value = log_ratio
    elif kl_estimator == "k2":
        value = log_ratio**2 / 2.0
    elif kl_estimator == "k3":
        value = (-log_ratio).exp() - 1 + log_ratio
    value = value.clamp(min=-10, max=10)
    if unbiased_gradient:
        surrogate = log_ratio.detach() * log_probs
        return value.detach() + surrogate - surrogate.detach()
    return value


def masked_mean(tensor, mask, dim=None):
    if mask is None:
        return tensor.mean(dim=dim)
    return (tensor * mask).sum(dim=dim) / mask.sum(dim=dim)
"""

# TRL 0.14-1.16: the sampled token's log-prob from logits, without the full
# log-softmax in memory.
_TRL_UTILS = """
import torch


def selective_log_softmax(logits, index):
    return torch.gather(logits.log_softmax(-1), dim=-1, index=index.unsqueeze(-1)).squeeze(-1)
"""

# torch's loss modules: ``nn.KLDivLoss(reduction=..., log_target=...)`` built
# once, then called as ``self.kl(input, target)``. The object is the
# functional form with the constructor's settings given in advance.
_TORCH_LOSS_MODULES = """
import torch.nn.functional as F


def KLDivLoss(input, target, size_average=None, reduce=None, reduction="mean", log_target=False):
    return F.kl_div(input, target, reduction=reduction, log_target=log_target)
"""

_SOURCES = {
    "torch.nn": _TORCH_LOSS_MODULES,
    "verl.trainer.ppo.core_algos": _VERL_CORE_ALGOS,
    "openrlhf.models.utils": _OPENRLHF_MODEL_UTILS,
    "trl.trainer.utils": _TRL_UTILS,
}
_MODULES: dict[str, ModuleInfo] = {}


def function(module: str, name: str) -> FuncRef | None:
    """The stand-in for ``name`` of library module ``module``, if kllint has one."""
    source = _SOURCES.get(module)
    if source is None:
        return None
    info = _MODULES.get(module)
    if info is None:
        path = Path(f"<{module}>")
        info = _MODULES[module] = ModuleInfo(path, cst.parse_module(source), source)
    if name not in info.functions:
        return None
    return FuncRef(unparsed(info.functions, name), info)


LOSS_MODULES = frozenset({"KLDivLoss"})


def loss_module(name: str) -> FuncRef | None:
    """``torch.nn.KLDivLoss``: the function an instance computes when called."""
    return function("torch.nn", name) if name in LOSS_MODULES else None


def is_library(module: ModuleInfo) -> bool:
    """Whether ``module`` is one of these stand-ins (never a file to report on)."""
    return any(info is module for info in _MODULES.values())
