# Reviewer: NeMo-RL-style clipped PG loss launched with python-fire. `main`
# exposes `fused_ref_kl: bool = True` ("compute the reference KL inside the
# log-prob pass, without activation memory") and passes it into the loss config.
# With that default the loss computes its KL term inside `torch.no_grad()`
# (chosen through a conditional context manager), then adds it to the loss. The
# estimator is right (k2 of the sequence log-ratio) but the term has no gradient
# path: the regulariser does nothing, whatever reference_policy_kl_penalty is.
# Verdict: bug, KL005, reported on the `seq_kl = 0.5 * (...)` line that computes
# the estimate under the no-grad context.
import contextlib
from typing import TypedDict

import fire
import torch

from nemo_rl.algorithms.loss_functions import LossFunction
from nemo_rl.distributed.batched_data_dict import BatchedDataDict


class ClippedPGLossConfig(TypedDict):
    reference_policy_kl_penalty: float
    ratio_clip_min: float
    ratio_clip_max: float
    fused_ref_kl: bool


class ClippedPGLossFn(LossFunction):
    def __init__(self, cfg: ClippedPGLossConfig):
        self.kl_penalty = cfg["reference_policy_kl_penalty"]
        self.clip_min = cfg["ratio_clip_min"]
        self.clip_max = cfg["ratio_clip_max"]
        self.fused_ref_kl = cfg["fused_ref_kl"]

    def __call__(self, curr_logprobs, data: BatchedDataDict):
        mask = data["token_mask"]
        prev_logprobs = data["prev_logprobs"]
        ref_logprobs = data["reference_policy_logprobs"]
        advantages = data["advantages"]

        ratios = (curr_logprobs - prev_logprobs).exp()
        clipped = ratios.clamp(1.0 - self.clip_min, 1.0 + self.clip_max)
        pg = torch.max(-advantages * ratios, -advantages * clipped)
        pg_loss = (pg * mask).sum(-1).mean()

        kl_ctx = torch.no_grad() if self.fused_ref_kl else contextlib.nullcontext()
        with kl_ctx:
            # error: KL005
            seq_kl = 0.5 * ((curr_logprobs - ref_logprobs) * mask).sum(-1).pow(2)
        kl_loss = seq_kl.mean()
        loss = pg_loss + self.kl_penalty * kl_loss
        return loss, {"loss": loss.item(), "kl_penalty": kl_loss.item()}


def make_loss_config(kl_penalty: float = 0.01, clip: float = 0.2, fused_ref_kl: bool = True) -> ClippedPGLossConfig:
    return ClippedPGLossConfig(
        reference_policy_kl_penalty=kl_penalty,
        ratio_clip_min=clip,
        ratio_clip_max=clip,
        fused_ref_kl=fused_ref_kl,
    )


def main(
    model: str = "meta-llama/Llama-3.2-1B-Instruct",
    kl_penalty: float = 0.01,
    clip: float = 0.2,
    fused_ref_kl: bool = True,
    num_steps: int = 100,
):
    loss_cfg = make_loss_config(kl_penalty=kl_penalty, clip=clip, fused_ref_kl=fused_ref_kl)
    loss_fn = ClippedPGLossFn(loss_cfg)
    return {"model": model, "loss_fn": loss_fn, "num_steps": num_steps}


if __name__ == "__main__":
    fire.Fire(main)
