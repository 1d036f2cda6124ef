# Reviewer: slime-style Megatron actor step. The context for the reference
# forward is chosen per platform at import time: on Ascend (torch_npu present)
# a nullcontext, on CUDA/CPU torch.no_grad. The sequence-level k2 KL is
# computed INSIDE that `with _ref_forward_ctx():` block, next to the reference
# log-probs, and then added to the loss. On the default CUDA machine the block
# is no_grad, so the KL term has no gradient path: it is a constant and the
# regulariser does nothing (gradient exactly zero). The estimator is right.
# Verdict: bug, KL005, reported on the KL line inside the no_grad-aliased block.
import contextlib
import importlib.util

import torch

from megatron.core import mpu
from slime.utils.ppo_utils import compute_policy_loss

if importlib.util.find_spec("torch_npu") is not None:
    import torch_npu  # noqa: F401

    # HCCL keeps graph buffers alive under no_grad on Ascend; let autograd free them.
    _ref_forward_ctx = contextlib.nullcontext
else:
    _ref_forward_ctx = torch.no_grad


def token_log_probs(logits, tokens):
    return torch.gather(logits.float().log_softmax(-1), -1, tokens.unsqueeze(-1)).squeeze(-1)


def actor_loss(log_probs, ref_logits, tokens, old_log_probs, advantages, loss_mask, kl_coef=0.02, eps=0.2):
    ratio = torch.exp(log_probs - old_log_probs)
    pg = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - eps, 1 + eps))
    pg_loss = (pg * loss_mask).sum(-1).mean()
    with _ref_forward_ctx():
        ref_log_probs = token_log_probs(ref_logits, tokens)
        seq_log_ratio = ((log_probs - ref_log_probs) * loss_mask).sum(-1)
        # error: KL005
        kl = 0.5 * seq_log_ratio.pow(2)
    kl_loss = kl.mean()
    return pg_loss + kl_coef * kl_loss, {"kl_loss": kl_loss.item(), "pg_loss": pg_loss.item()}


def train_step(model, ref_model, optimizer, batch, args):
    tokens = batch["tokens"]
    logits = model(tokens[:, :-1])
    log_probs = token_log_probs(logits, tokens[:, 1:])
    with torch.no_grad():
        ref_logits = ref_model(tokens[:, :-1])
    loss, metrics = actor_loss(log_probs, ref_logits, tokens[:, 1:], batch["log_probs"], batch["advantages"],
                               batch["loss_mask"], kl_coef=args.kl_coef)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    metrics["dp_rank"] = mpu.get_data_parallel_rank() if args.log_rank else 0
    return metrics
