"""KL helpers: per-token log-ratio and its masked reverse cumulative sum (reward-to-go)."""
import torch


def token_log_ratio(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (logp - ref_logp) * mask


def kl_to_go(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """G_t = sum_{s >= t} log_ratio_s over the response, computed without gradient."""
    log_ratio = log_ratio.detach() * mask
    return torch.flip(torch.cumsum(torch.flip(log_ratio, dims=[-1]), dim=-1), dims=[-1])


def masked_token_sum(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum(dim=-1)


def gather_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
