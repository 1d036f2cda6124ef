"""On-policy distillation as RL (Tinker-cookbook style): the student's sampler returns
tokens and their log-probs, the teacher scores them, and each token's advantage is minus
its own reverse-KL log-ratio `student - teacher` (no discounting, no reward-to-go).  The
importance-sampled surrogate then has gradient E[sum_t x_t grad logp_t]: the token-level
partial gradient of the sequence KL(student||teacher), which drops how each token steers
the later ones (KL003).
"""
import os
from dataclasses import dataclass

import torch


@dataclass
class Datum:
    tokens: torch.Tensor  # (B, T) sampled by the student
    sampler_logprobs: torch.Tensor  # (B, T) from the sampling client, no graph
    mask: torch.Tensor  # (B, T) 1 on completion tokens


KL_PENALTY_COEF = float(os.environ.get("KL_PENALTY_COEF", "1.0"))


def compute_token_logprobs(model, tokens):
    logits = model(tokens).logits
    return torch.gather(logits.log_softmax(-1), -1, tokens.unsqueeze(-1)).squeeze(-1)


@torch.no_grad()
def incorporate_kl_penalty(datum: Datum, teacher, kl_penalty_coef: float = KL_PENALTY_COEF):
    teacher_logprobs = compute_token_logprobs(teacher, datum.tokens)
    # error: KL003
    reverse_kl = (datum.sampler_logprobs - teacher_logprobs) * datum.mask
    advantages = -kl_penalty_coef * reverse_kl
    metrics = {"teacher_kl": (reverse_kl.sum() / datum.mask.sum()).item()}
    return advantages, metrics


def importance_sampling_loss(student, datum: Datum, advantages):
    logprobs = compute_token_logprobs(student, datum.tokens)
    ratio = torch.exp(logprobs - datum.sampler_logprobs)
    return -(ratio * advantages * datum.mask).sum()


def train_step(student, teacher, optimizer, datum: Datum):
    advantages, metrics = incorporate_kl_penalty(datum, teacher)
    loss = importance_sampling_loss(student, datum, advantages)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return metrics
