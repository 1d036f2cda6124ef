"""KL estimators, grouped on one class so that call sites read KLUtils.k3(...)."""
import torch


class KLUtils:
    """Per-token estimates of KL(pi||pi_ref) from sampled-token log-probs."""

    @staticmethod
    def log_ratio(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
        return logps - ref_logps

    @staticmethod
    def k1(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
        return KLUtils.log_ratio(logps, ref_logps)

    @staticmethod
    def k3(logps: torch.Tensor, ref_logps: torch.Tensor) -> torch.Tensor:
        """Schulman's low-variance estimator exp(ref - logp) - (ref - logp) - 1."""
        delta = ref_logps - logps
        return torch.exp(delta) - delta - 1

    @staticmethod
    def masked_sequence_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return (values * mask).sum(dim=-1)
