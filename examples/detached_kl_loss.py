"""KL005 (kl-loss-without-gradient): a KL loss term computed under
torch.no_grad(), next to its fix.

Whatever the estimator, a term computed without gradient adds a constant to
the loss: its gradient is exactly zero and beta does nothing. Note that simply
deleting the no_grad would turn this k3 term into KL002 (the gradient of
KL(pi_ref||pi), per token); the fix uses the reward-to-go score function.

Run: python examples/detached_kl_loss.py  (CPU, a few seconds)
kllint reports KL005 on the `per_token_kl = ...` line of loss_detached_kl;
loss_fixed is clean.
"""

import torch

from tabular import initial_policies, print_optimum, report, train, true_kl

BETA = 1.0
BATCH = 256
STEPS = 300


def loss_detached_kl(per_token_logps, ref_per_token_logps, rewards, completion_mask, beta):
    advantages = rewards - (rewards.sum() - rewards) / (rewards.numel() - 1)
    with torch.no_grad():
        per_token_kl = torch.exp(ref_per_token_logps - per_token_logps) - (ref_per_token_logps - per_token_logps) - 1
    per_token_loss = -advantages.unsqueeze(1) * per_token_logps + beta * per_token_kl
    loss = (per_token_loss * completion_mask).sum(dim=1).mean()
    return loss


def loss_fixed(per_token_logps, ref_per_token_logps, rewards, completion_mask, beta):
    advantages = rewards - (rewards.sum() - rewards) / (rewards.numel() - 1)
    log_ratio = (per_token_logps - ref_per_token_logps).detach() * completion_mask
    kl_to_go = log_ratio.flip(-1).cumsum(-1).flip(-1)
    per_token_loss = -advantages.unsqueeze(1) * per_token_logps + beta * kl_to_go * per_token_logps
    loss = (per_token_loss * completion_mask).sum(dim=1).mean()
    return loss


def main():
    policy, ref_model = initial_policies()
    print(f"beta = {BETA}; at the start KL(pi||pi_ref) = {true_kl(policy, ref_model):.3f}")
    print(f"after {STEPS} steps of {BATCH} sequences:")
    report("k3 loss under no_grad (KL005)", *train(loss_detached_kl, BETA, STEPS, BATCH), BETA)
    report("reward-to-go score function", *train(loss_fixed, BETA, STEPS, BATCH), BETA)
    print_optimum(ref_model, BETA)


if __name__ == "__main__":
    main()
