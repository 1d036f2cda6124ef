# Reviewer: e08 module: per-token log-probs and entropy from logits.
import torch


def calculate_log_probs_and_entropy(logits, tokens, with_entropy: bool = False):
    log_probs_full = torch.log_softmax(logits.float(), dim=-1)
    log_probs = log_probs_full.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_probs_full.exp() * log_probs_full).sum(-1) if with_entropy else None
    return log_probs, entropy
