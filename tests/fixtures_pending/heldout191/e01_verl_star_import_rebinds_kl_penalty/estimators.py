# Reviewer: the current estimators. kl_penalty keeps the value of the
# log-ratio (what is logged) and gives it the gradient of the sequence
# KL(pi||pi_ref): each token's score weighted by the log-ratio to go.
import torch


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis=None) -> torch.Tensor:
    if axis is None:
        return (values * mask).sum() / mask.sum().clamp(min=1.0)
    return (values * mask).sum(axis) / mask.sum(axis).clamp(min=1.0)


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """seq-mean-token-sum: sum over the response, mean over sequences."""
    return (loss_mat * loss_mask).sum(-1).mean()


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Per-token KL term for the actor loss.

    Value: the log-ratio, so `actor/kl_loss` stays comparable with older runs.
    Gradient: sum_t G_t grad logprob_t with G_t the log-ratio summed from t to
    the end of the response.
    """
    log_ratio = (logprob - ref_logprob).detach() * response_mask
    kl_to_go = log_ratio.flip(-1).cumsum(-1).flip(-1)
    return log_ratio + kl_to_go * (logprob - logprob.detach())


def compute_entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    pd = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (pd * logits).sum(-1)
