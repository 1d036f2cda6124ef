from collections import defaultdict

import torch


def compute_grpo_outcome_advantage(token_level_scores, eos_mask, index, epsilon: float = 1e-6):
    """Outcome reward normalised within each prompt group, broadcast to every response token."""
    scores = token_level_scores.sum(dim=-1)
    id2scores = defaultdict(list)
    for i in range(scores.shape[0]):
        id2scores[index[i]].append(scores[i])
    id2mean, id2std = {}, {}
    for idx, group in id2scores.items():
        group = torch.stack(group)
        id2mean[idx] = group.mean()
        id2std[idx] = group.std() if len(group) > 1 else torch.tensor(1.0)
    normed = torch.stack([(scores[i] - id2mean[index[i]]) / (id2std[index[i]] + epsilon) for i in range(scores.shape[0])])
    return normed.unsqueeze(-1) * eos_mask


def apply_kl_to_advantage(advantages, log_prob, ref_log_prob, eos_mask, kl_coef: float):
    """Per-token KL shaping applied directly on the advantage (a 'dense' KL reward)."""
    # error: KL003
    kl = log_prob - ref_log_prob
    return (advantages - kl_coef * kl) * eos_mask
