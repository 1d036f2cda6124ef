"""KL-to-the-reference helpers for score-function penalties.

The weights returned here carry no gradient; the loss multiplies them by the
current log-probs to form a score-function term.
"""

import torch


def log_ratio(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Masked per-token log-ratio log pi - log pi_ref (no gradient)."""
    return (logprobs.detach() - ref_logprobs) * mask


def kl_to_go(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """G_t = sum_{s >= t} sg(log pi(y_s) - log pi_ref(y_s)) over valid positions.

    Weighting log pi(y_t) by G_t gives a score-function estimate of
    grad KL(pi || pi_ref) for the whole sequence.
    """
    lr = log_ratio(logprobs, ref_logprobs, mask)
    return torch.flip(torch.cumsum(torch.flip(lr, dims=(-1,)), dim=-1), dims=(-1,)) * mask
