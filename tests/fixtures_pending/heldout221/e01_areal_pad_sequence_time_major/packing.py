"""Packing helpers for 1-D micro-batches.

A packed micro-batch concatenates every sequence (prompt + response) into one
row. ``cu_seqlens`` holds the boundaries: ``x[cu_seqlens[i]:cu_seqlens[i + 1]]``
is sequence ``i``. The actor uses these helpers to reduce per-token log-probs,
KL terms and losses per sequence.
"""
from typing import Dict, List

import torch
from torch.nn.utils.rnn import pad_sequence


def cu_seqlens_from_lens(seqlens: List[int], device=None) -> torch.Tensor:
    lens = torch.tensor(seqlens, dtype=torch.int32, device=device)
    return torch.nn.functional.pad(lens.cumsum(0, dtype=torch.int32), (1, 0))


def seqlens_from_cu(cu_seqlens: torch.Tensor) -> List[int]:
    return (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()


def split_packed(x: torch.Tensor, cu_seqlens: torch.Tensor):
    """Split a packed [total_tokens] tensor into one tensor per sequence."""
    return torch.split(x, seqlens_from_cu(cu_seqlens), dim=0)


def pad_packed(x: torch.Tensor, cu_seqlens: torch.Tensor, padding_value: float = 0.0) -> torch.Tensor:
    """Pad a packed tensor to one row per sequence, so that per-sequence sums of
    log-probs or of the KL log-ratio are a ``.sum(-1)`` away."""
    return pad_sequence(list(split_packed(x, cu_seqlens)), padding_value=padding_value)


def pack_tensor_dict(samples: List[Dict[str, torch.Tensor]]) -> Dict[str, torch.Tensor]:
    """Concatenate per-sample dicts into one packed micro-batch."""
    lens = [s["input_ids"].numel() for s in samples]
    packed = {k: torch.cat([s[k] for s in samples]) for k in samples[0]}
    packed["cu_seqlens"] = cu_seqlens_from_lens(lens, device=samples[0]["input_ids"].device)
    packed["max_seqlen"] = max(lens)
    return packed
