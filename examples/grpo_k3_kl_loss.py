"""KL002 (differentiated-k3-estimate): a GRPO-style loss with the per-token k3
KL penalty, next to its fix.

k3 = exp(ref - logp) - (ref - logp) - 1 is an unbiased estimate of the *value*
of KL(pi||pi_ref), but autograd differentiates it into
(1 - exp(-(logp - ref))) * grad logp, whose expectation under pi is the
gradient of KL(pi_ref||pi), the divergence with its arguments swapped; and
summed over tokens it keeps only each token's own term (a per-token gradient).

The fix keeps the logged value and replaces only the gradient: each token's
score is weighted by the reward-to-go of the log-ratio,
G_t = sum_{s>=t} sg(logp_s - ref_s), the gradient of the sequence KL(pi||pi_ref).

Run: python examples/grpo_k3_kl_loss.py  (CPU, a few seconds)
kllint reports KL002 on the `per_token_kl = ...` line of grpo_loss_k3;
grpo_loss_fixed is clean.
"""

import torch

from tabular import initial_policies, print_optimum, report, train, true_kl

BETA = 1.0
BATCH = 256
STEPS = 300


def grpo_loss_k3(per_token_logps, ref_per_token_logps, rewards, completion_mask, beta):
    # Group baseline: leave-one-out mean of the other completions' rewards.
    advantages = rewards - (rewards.sum() - rewards) / (rewards.numel() - 1)
    ratio = torch.exp(per_token_logps - per_token_logps.detach())
    per_token_kl = torch.exp(ref_per_token_logps - per_token_logps) - (ref_per_token_logps - per_token_logps) - 1
    per_token_loss = -ratio * advantages.unsqueeze(1) + beta * per_token_kl
    loss = (per_token_loss * completion_mask).sum(dim=1).mean()
    return loss


def grpo_loss_fixed(per_token_logps, ref_per_token_logps, rewards, completion_mask, beta):
    advantages = rewards - (rewards.sum() - rewards) / (rewards.numel() - 1)
    ratio = torch.exp(per_token_logps - per_token_logps.detach())
    # Same value as k3 (for logging), gradient G_t * grad logp_t with the
    # reward-to-go G_t = sum_{s>=t} sg(logp_s - ref_s): the sequence KL(pi||pi_ref).
    log_ratio = (per_token_logps - ref_per_token_logps).detach() * completion_mask
    kl_to_go = torch.flip(torch.cumsum(torch.flip(log_ratio, [1]), 1), [1])
    k3_value = torch.exp(-log_ratio) + log_ratio - 1
    per_token_kl = k3_value + kl_to_go * (per_token_logps - per_token_logps.detach())
    per_token_loss = -ratio * advantages.unsqueeze(1) + beta * per_token_kl
    loss = (per_token_loss * completion_mask).sum(dim=1).mean()
    return loss


def main():
    policy, ref_model = initial_policies()
    print(f"beta = {BETA}; at the start KL(pi||pi_ref) = {true_kl(policy, ref_model):.3f}")
    print(f"after {STEPS} steps of {BATCH} sequences:")
    report("k3 per-token loss (KL002)", *train(grpo_loss_k3, BETA, STEPS, BATCH), BETA)
    report("reward-to-go surrogate (fixed)", *train(grpo_loss_fixed, BETA, STEPS, BATCH), BETA)
    print_optimum(ref_model, BETA)


if __name__ == "__main__":
    main()
