# Reviewer: AReaL-style GRPO actor on packed 1-D micro-batches: every sequence
# (prompt + response) of a micro-batch is concatenated into one row and
# `cu_seqlens` marks the boundaries. Under the default PPOActorConfig
# (kl_ctl=0.05) the loss adds a "sequence-level" k2 KL term: the packed,
# masked log-ratio is split per sequence and padded by packing.pad_packed(),
# which calls pad_sequence WITHOUT batch_first. The padded tensor is
# [max_len, n_seqs] (time major), so `.sum(-1)` adds up the same POSITION of
# the different sequences instead of the tokens of one sequence. The squared
# "sequence log-ratio" is a per-position k2, summed over positions: its
# expected gradient is the token-level (partial) gradient of KL(pi||pi_ref),
# for one sequence per pack as for many (the other sequences' log-ratios at the
# same position are independent and drop out in expectation).
# Verdict: bug, KL003, reported on the `seq_kl = 0.5 * ...square()` line in actor.py.
"""Packed-sequence GRPO actor (AReaL-style fork).

Modules:
    config        -- PPOActorConfig with the defaults used in training
    packing       -- cu_seqlens helpers (split / pad a packed micro-batch)
    functional    -- log-prob gathering and the clipped PPO token loss
    actor         -- grpo_loss_fn (PG loss + KL loss) and PPOActor.ppo_update
"""
from .actor import PPOActor, grpo_loss_fn
from .config import PPOActorConfig

__all__ = ["PPOActor", "PPOActorConfig", "grpo_loss_fn"]
