"""Megatron-LM ``forward_step`` for REINFORCE with a KL penalty to the SFT model.

The KL term is the score-function estimator of the sequence KL: each token's
log-prob is weighted by the (detached) log-ratio of that token and of every
later token of its response, a reverse cumulative sum.
"""

from functools import partial

import torch
from megatron.core import mpu
from megatron.training import get_args, get_timers
from megatron.training.utils import average_losses_across_data_parallel_group


def get_batch(data_iterator):
    """Tokens, per-position labels and masks of a rollout micro-batch."""
    data = next(data_iterator)
    tokens_ = data["tokens"].long()
    labels = tokens_[:, 1:].contiguous()
    tokens = tokens_[:, :-1].contiguous()
    loss_mask = data["loss_mask"][:, 1:].float()  # 1 on response tokens
    ref_logprobs = data["ref_logprobs"][:, 1:].float()
    advantages = data["advantages"].float()
    attention_mask = None
    position_ids = torch.arange(tokens.size(1), device=tokens.device).unsqueeze(0).expand_as(tokens)
    return tokens, labels, loss_mask, attention_mask, position_ids, ref_logprobs, advantages


def loss_func(labels, loss_mask, ref_logprobs, advantages, output_tensor):
    args = get_args()
    logits = output_tensor.float()
    logprobs = torch.log_softmax(logits, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)

    log_ratio = (logprobs.detach() - ref_logprobs) * loss_mask
    kl_to_go = torch.flip(torch.cumsum(torch.flip(log_ratio, dims=[1]), dim=1), dims=[1])
    # ok: KL003
    kl_surrogate = kl_to_go * logprobs

    pg_losses = -advantages.unsqueeze(-1) * logprobs
    losses = pg_losses + args.kl_beta * kl_surrogate
    loss = torch.sum(losses.view(-1) * loss_mask.view(-1)) / loss_mask.sum()

    # reported: the sequence log-ratio (k1 of the whole response), averaged over the micro-batch
    seq_kl = log_ratio.sum(dim=-1).mean()
    averaged = average_losses_across_data_parallel_group([loss, seq_kl])
    return loss, {"lm loss": averaged[0], "kl": averaged[1]}


def forward_step(data_iterator, model):
    """Forward step; the schedule calls the returned loss function and runs backward."""
    timers = get_timers()
    timers("batch-generator", log_level=2).start()
    tokens, labels, loss_mask, attention_mask, position_ids, ref_logprobs, advantages = get_batch(data_iterator)
    timers("batch-generator").stop()

    output_tensor = model(tokens, position_ids, attention_mask)
    if mpu.get_tensor_model_parallel_world_size() > 1:
        raise NotImplementedError("vocab-parallel log-probs are not wired up in this example")

    return output_tensor, partial(loss_func, labels, loss_mask, ref_logprobs, advantages)
