# Reviewer: e08 utils module: the sequence log-ratio and KL estimates of it.
import torch


def sequence_log_ratio(log_probs, ref_log_probs, loss_mask):
    return ((log_probs - ref_log_probs) * loss_mask).sum(dim=-1)


def compute_seq_kl(log_probs, ref_log_probs, loss_mask, kl_loss_type: str = "low_var_kl"):
    seq_lr = sequence_log_ratio(log_probs, ref_log_probs, loss_mask)
    if kl_loss_type == "k2":
        return 0.5 * seq_lr.pow(2)
    if kl_loss_type == "low_var_kl":
        return torch.exp(-seq_lr) + seq_lr - 1
    return seq_lr
