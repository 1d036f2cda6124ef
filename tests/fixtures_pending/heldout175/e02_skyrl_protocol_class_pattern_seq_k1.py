# Reviewer: SkyRL-style policy loss (Python 3.12 syntax: a PEP 695 `type` alias
# and a generic `def masked_sum[T: torch.Tensor]`). KL estimators are frozen,
# slotted dataclasses that satisfy a `typing.Protocol`; `build_kl_estimator`
# picks one with structural pattern matching on the config object (class
# patterns with keyword sub-patterns, an or-pattern on the name and a guard).
# The default `kl_estimator_type="k1"` builds `SequenceK1`, which returns the
# masked SUM of the log-ratio over the response: k1 of the whole sequence, with
# its gradient. The loss adds `kl_loss_coef * kl.mean()`; the expected gradient
# is zero (the score of a sequence has mean zero). The k2 alternative is correct.
# Verdict: bug, KL001, reported where the loss calls the estimator (`kl = self.kl_estimator(...)`).
from dataclasses import dataclass
from typing import Literal, Protocol

import torch

from skyrl_train.utils.ppo_utils import PolicyLossRegistry

type LogProbs = torch.Tensor
type Mask = torch.Tensor
type EstimatorName = Literal["k1", "kl", "seq_k2"]


class KLEstimator(Protocol):
    def __call__(self, logprobs: LogProbs, base_logprobs: LogProbs, mask: Mask) -> torch.Tensor: ...


def masked_sum[T: torch.Tensor](values: T, mask: T, dim: int = -1) -> T:
    return (values * mask).sum(dim=dim)


@dataclass(frozen=True, slots=True)
class SequenceK1:
    clamp: float | None = None

    def __call__(self, logprobs: LogProbs, base_logprobs: LogProbs, mask: Mask) -> torch.Tensor:
        log_ratio = logprobs - base_logprobs
        if self.clamp is not None:
            log_ratio = log_ratio.clamp(-self.clamp, self.clamp)
        return masked_sum(log_ratio, mask)


@dataclass(frozen=True, slots=True)
class SequenceK2:
    def __call__(self, logprobs: LogProbs, base_logprobs: LogProbs, mask: Mask) -> torch.Tensor:
        return 0.5 * masked_sum(logprobs - base_logprobs, mask).square()


@dataclass(slots=True, kw_only=True)
class AlgorithmConfig:
    eps_clip_low: float = 0.2
    eps_clip_high: float = 0.2
    use_kl_loss: bool = True
    kl_loss_coef: float = 0.001
    kl_estimator_type: EstimatorName = "k1"
    kl_clamp: float | None = None


def build_kl_estimator(cfg: AlgorithmConfig) -> KLEstimator | None:
    match cfg:
        case AlgorithmConfig(use_kl_loss=False):
            return None
        case AlgorithmConfig(kl_loss_coef=coef) if coef <= 0.0:
            return None
        case AlgorithmConfig(kl_estimator_type="k1" | "kl", kl_clamp=clamp):
            return SequenceK1(clamp=clamp)
        case AlgorithmConfig(kl_estimator_type="seq_k2"):
            return SequenceK2()
        case AlgorithmConfig(kl_estimator_type=name):
            raise ValueError(f"unsupported kl_estimator_type: {name}")


class PPOPolicyLoss:
    def __init__(self, cfg: AlgorithmConfig) -> None:
        self.cfg = cfg
        self.kl_estimator = build_kl_estimator(cfg)

    def __call__(
        self,
        logprobs: LogProbs,
        old_logprobs: LogProbs,
        base_logprobs: LogProbs | None,
        advantages: torch.Tensor,
        loss_mask: Mask,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        ratio = (logprobs - old_logprobs).exp()
        surr1 = ratio * advantages
        surr2 = ratio.clamp(1 - self.cfg.eps_clip_low, 1 + self.cfg.eps_clip_high) * advantages
        pg_loss = masked_sum(-torch.minimum(surr1, surr2), loss_mask).mean()
        metrics = {"policy_loss": pg_loss.item()}
        loss = pg_loss
        if self.kl_estimator is not None and base_logprobs is not None:
            # error: KL001
            kl = self.kl_estimator(logprobs, base_logprobs, loss_mask)
            loss = loss + self.cfg.kl_loss_coef * kl.mean()
            metrics["kl_loss"] = kl.mean().item()
        return loss, metrics


def policy_train_step(model, optimizer, loss_fn: PPOPolicyLoss, batch: dict[str, torch.Tensor]) -> dict[str, float]:
    logprobs = model.forward_logprobs(batch["sequences"], batch["attention_mask"], batch["num_actions"])
    loss, metrics = loss_fn(logprobs, batch["action_log_probs"], batch.get("base_action_log_probs"), batch["advantages"], batch["loss_mask"])
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return metrics
