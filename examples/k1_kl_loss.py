"""KL001 (differentiated-k1-estimate): the log-ratio k1 = logp - ref used as a
KL loss, next to its fix.

k1 is an unbiased estimate of the value of KL(pi||pi_ref), but autograd
differentiates it into grad logp, and E[grad logp] = 0 under samples from pi:
the penalty adds noise and no regularisation at all. The policy runs to the
reward-maximising sequence whatever beta is.

Run: python examples/k1_kl_loss.py  (CPU, a few seconds)
kllint reports KL001 on the `per_token_kl = ...` line of loss_k1;
loss_fixed is clean.
"""

from tabular import initial_policies, print_optimum, report, train, true_kl

BETA = 1.0
BATCH = 256
STEPS = 300


def loss_k1(per_token_logps, ref_per_token_logps, rewards, completion_mask, beta):
    advantages = rewards - (rewards.sum() - rewards) / (rewards.numel() - 1)
    per_token_kl = per_token_logps - ref_per_token_logps
    per_token_loss = -advantages.unsqueeze(1) * per_token_logps + beta * per_token_kl
    loss = (per_token_loss * completion_mask).sum(dim=1).mean()
    return loss


def loss_fixed(per_token_logps, ref_per_token_logps, rewards, completion_mask, beta):
    advantages = rewards - (rewards.sum() - rewards) / (rewards.numel() - 1)
    # Score function with the reward-to-go G_t = sum_{s>=t} sg(logp_s - ref_s).
    log_ratio = (per_token_logps - ref_per_token_logps).detach() * completion_mask
    kl_to_go = log_ratio.flip(-1).cumsum(-1).flip(-1)
    per_token_loss = -advantages.unsqueeze(1) * per_token_logps + beta * kl_to_go * per_token_logps
    loss = (per_token_loss * completion_mask).sum(dim=1).mean()
    return loss


def main():
    policy, ref_model = initial_policies()
    print(f"beta = {BETA}; at the start KL(pi||pi_ref) = {true_kl(policy, ref_model):.3f}")
    print(f"after {STEPS} steps of {BATCH} sequences:")
    report("k1 per-token loss (KL001)", *train(loss_k1, BETA, STEPS, BATCH), BETA)
    report("reward-to-go score function", *train(loss_fixed, BETA, STEPS, BATCH), BETA)
    print_optimum(ref_model, BETA)


if __name__ == "__main__":
    main()
