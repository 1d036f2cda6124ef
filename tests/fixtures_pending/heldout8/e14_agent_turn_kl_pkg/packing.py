"""Helpers for packed (padding-free) multi-turn batches."""

import torch


def segment_ids_from_position_ids(position_ids: torch.Tensor) -> torch.Tensor:
    """[1, N] position ids that restart at 0 for each trajectory -> [N] segment index."""
    starts = (position_ids.view(-1) == 0).long()
    return starts.cumsum(0) - 1


def assistant_token_mask(role_ids: torch.Tensor, loss_turns: torch.Tensor | None = None) -> torch.Tensor:
    """1 on tokens the policy generated (role 1 = assistant); tool/user tokens are 0.

    ``loss_turns`` optionally restricts the loss to some assistant turns.
    """
    mask = role_ids == 1
    if loss_turns is not None:
        mask = mask & loss_turns
    return mask.float()


def per_segment_sum(values: torch.Tensor, segment_ids: torch.Tensor, n_segments: int) -> torch.Tensor:
    out = values.new_zeros(n_segments)
    return out.scatter_add(0, segment_ids, values)
