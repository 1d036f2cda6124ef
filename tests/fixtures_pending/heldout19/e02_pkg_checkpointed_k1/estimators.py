"""Per-token approximations of KL(pi || pi_ref) (OpenRLHF-style)."""

import torch


def approx_kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, kl_estimator: str = "k1") -> torch.Tensor:
    log_ratio = log_probs - ref_log_probs
    if kl_estimator == "k2":
        log_ratio = log_ratio**2 / 2.0
    elif kl_estimator == "k3":
        log_ratio = -log_ratio
        log_ratio = log_ratio.exp() - 1 - log_ratio
    return log_ratio
