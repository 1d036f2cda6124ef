import torch


def token_kl(logps: torch.Tensor, ref_logps: torch.Tensor, estimator: str = "k1") -> torch.Tensor:
    log_ratio = logps - ref_logps
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.pow(2)
    if estimator == "k3":
        return torch.exp(-log_ratio) + log_ratio - 1
    raise ValueError(f"unsupported estimator: {estimator}")
