"""KL helpers shared by the countdown / multiplication recipes."""
import torch


def sequence_log_ratio(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, eos_mask: torch.Tensor) -> torch.Tensor:
    return ((log_prob - ref_log_prob) * eos_mask).sum(dim=-1)


def kl_objective_term(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, eos_mask: torch.Tensor, coef: float) -> torch.Tensor:
    """Contribution of the KL regulariser to the objective (to be maximised).

    Already signed: callers add it to the objective.
    """
    seq_lr = sequence_log_ratio(log_prob, ref_log_prob, eos_mask)
    return -coef * 0.5 * (seq_lr**2).mean()


@torch.no_grad()
def kl_metric(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, eos_mask: torch.Tensor) -> float:
    return sequence_log_ratio(log_prob, ref_log_prob, eos_mask).mean().item()
