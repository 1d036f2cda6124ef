"""REINFORCE with a score-function KL penalty; the KL credit of each token is
computed by a matrix product with a triangular matrix built in a closure."""

import torch


def make_kl_credit(horizon: int):
    """Returns a function mapping per-token log-ratios (B, T) to per-token credit."""
    weights = torch.triu(torch.ones(horizon, horizon))

    def credit(log_ratio):
        return log_ratio @ weights.to(log_ratio.dtype)

    return credit


def reinforce_kl_loss(logps, ref_logps, mask, scores, beta=0.1):
    credit = make_kl_credit(logps.shape[-1])
    log_ratio = (logps - ref_logps).detach() * mask
    # error: KL003
    kl_term = credit(log_ratio) * logps
    pg_term = -scores.unsqueeze(-1) * logps
    return ((pg_term + beta * kl_term) * mask).sum(-1).mean()
