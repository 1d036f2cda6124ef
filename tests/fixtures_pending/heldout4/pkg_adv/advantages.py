"""Group-relative advantages with the KL folded in (NeMo-RL / slime style), on the driver.

The rollout's log-probs (``old_log_prob``, the policy that just generated) and the
reference's are stored tensors; the advantages computed here are written into the batch
and read back by the actor's PPO loss (``actor.py``) one token per advantage.

- ``seq_adv[:, None] - beta * kl_t``: each token is charged its *own* log-ratio only, so
  the KL part of the policy gradient is ``sum_t logr_t grad logp_t``: the token-level
  partial gradient of the sequence KL (KL003);
- ``seq_adv[:, None] - beta * kl_to_go_t`` with ``kl_to_go_t = sum_{s>=t} logr_s``: the
  cumulative estimator, grad KL(pi||pi_ref) (quiet).

Fixture: parsed by the tests, never executed.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch


def group_normalised_scores(scores: torch.Tensor, index: np.ndarray, epsilon: float = 1e-6) -> torch.Tensor:
    id2score = defaultdict(list)
    for i in range(scores.shape[0]):
        id2score[index[i]].append(scores[i])
    id2mean, id2std = {}, {}
    for idx, group in id2score.items():
        stacked = torch.stack(group)
        id2mean[idx] = stacked.mean()
        id2std[idx] = stacked.std() if len(group) > 1 else torch.tensor(1.0)
    out = torch.empty_like(scores)
    for i in range(scores.shape[0]):
        out[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + epsilon)
    return out


@torch.no_grad()
def compute_grpo_advantage_token_kl(token_level_rewards, response_mask, old_log_prob, ref_log_prob, index, kl_coef: float = 0.01):
    """Outcome advantage per response, minus each token's log-ratio."""
    scores = token_level_rewards.sum(dim=-1)
    seq_adv = group_normalised_scores(scores, index)
    # error: KL003
    kl = old_log_prob - ref_log_prob
    advantages = seq_adv[:, None] - kl_coef * kl
    advantages = advantages * response_mask
    return advantages, advantages


@torch.no_grad()
def compute_grpo_advantage_kl_to_go(token_level_rewards, response_mask, old_log_prob, ref_log_prob, index, kl_coef: float = 0.01):
    """Outcome advantage per response, minus the log-ratio of the token and of every later one."""
    scores = token_level_rewards.sum(dim=-1)
    seq_adv = group_normalised_scores(scores, index)
    # ok: KL001, KL002, KL003, KL004, KL005, KL006
    kl = (old_log_prob - ref_log_prob) * response_mask
    kl_to_go = torch.flip(torch.cumsum(torch.flip(kl, dims=[-1]), dim=-1), dims=[-1])
    advantages = seq_adv[:, None] - kl_coef * kl_to_go
    advantages = advantages * response_mask
    return advantages, advantages


def compute_advantage(data, adv_estimator: str = "grpo_token_kl", kl_coef: float = 0.01):
    args = (
        data.batch["token_level_rewards"],
        data.batch["response_mask"],
        data.batch["old_log_probs"],
        data.batch["ref_log_prob"],
        data.non_tensor_batch["uid"],
    )
    if adv_estimator == "grpo_token_kl":
        advantages, returns = compute_grpo_advantage_token_kl(*args, kl_coef=kl_coef)
    elif adv_estimator == "grpo_kl_to_go":
        advantages, returns = compute_grpo_advantage_kl_to_go(*args, kl_coef=kl_coef)
    else:
        raise NotImplementedError(adv_estimator)
    data.batch["advantages"] = advantages
    data.batch["returns"] = returns
    return data
