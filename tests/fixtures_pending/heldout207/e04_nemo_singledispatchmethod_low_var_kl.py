# Reviewer: NeMo-RL-style ClippedPGLossFn whose per-token KL is chosen by
# functools.singledispatchmethod on the TYPE of the estimator object in the
# config. The dataclass default is `kl_estimator=LowVarKL()`, so the LowVarKL
# implementation runs: k3, `exp(x) - x - 1` with x = ref - logp (clamped to
# +-20, never active), returned per token with the policy's gradient; __call__
# adds `reference_policy_kl_penalty * sum_t kl_t` to the loss. Its expected
# gradient is the token-level gradient of KL(pi_ref||pi).
# Verdict: bug, KL002, reported where __call__ calls the dispatched helper
# (`kl = self.per_token_kl(...)`).
import functools
from dataclasses import dataclass, field

import torch
from nemo_rl.algorithms.interfaces import LossFunction, LossType
from nemo_rl.distributed.batched_data_dict import BatchedDataDict


@dataclass(frozen=True)
class LowVarKL:
    clamp: float = 20.0


@dataclass(frozen=True)
class TokenK2:
    pass


@dataclass
class ClippedPGLossConfig:
    reference_policy_kl_penalty: float = 0.01
    ratio_clip_min: float = 0.2
    ratio_clip_max: float = 0.2
    max_seq_len: int = 1024
    kl_estimator: object = field(default_factory=LowVarKL)


class ClippedPGLossFn(LossFunction):
    loss_type = LossType.SEQUENCE_LEVEL

    def __init__(self, cfg: ClippedPGLossConfig):
        self.cfg = cfg

    @functools.singledispatchmethod
    def per_token_kl(self, estimator, curr_logprobs, ref_logprobs):
        raise NotImplementedError(f"no KL implementation for {type(estimator).__name__}")

    @per_token_kl.register
    def _(self, estimator: LowVarKL, curr_logprobs, ref_logprobs):
        x = (ref_logprobs - curr_logprobs).clamp(-estimator.clamp, estimator.clamp)
        return x.exp() - x - 1

    @per_token_kl.register
    def _(self, estimator: TokenK2, curr_logprobs, ref_logprobs):
        # ok: KL003
        return 0.5 * (curr_logprobs - ref_logprobs).square()

    def __call__(self, curr_logprobs, data: BatchedDataDict):
        cfg = self.cfg
        mask = data["token_mask"][:, 1:]
        prev_logprobs = data["prev_logprobs"][:, 1:]
        ref_logprobs = data["reference_policy_logprobs"][:, 1:]
        advantages = data["advantages"][:, 1:]
        ratios = (curr_logprobs - prev_logprobs).exp()
        clipped = ratios.clamp(1 - cfg.ratio_clip_min, 1 + cfg.ratio_clip_max)
        pg = torch.max(-advantages * ratios, -advantages * clipped)
        loss = (pg * mask).sum() / (mask.size(0) * cfg.max_seq_len)
        if cfg.reference_policy_kl_penalty != 0:
            # error: KL002
            kl = self.per_token_kl(cfg.kl_estimator, curr_logprobs, ref_logprobs)
            kl_loss = (kl * mask).sum(-1).mean()
            loss = loss + cfg.reference_policy_kl_penalty * kl_loss
        return loss, {"loss": loss.item(), "num_valid_samples": mask.size(0)}
