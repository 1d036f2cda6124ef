import torch


def low_var_kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    log_ratio = ref_log_probs - log_probs
    return log_ratio.exp() - log_ratio - 1
