"""KL003 (token-level-kl-gradient): k2 = 0.5 * (logp - ref)**2 per token,
summed over tokens, next to its fix.

Per token, autograd gives (logp_t - ref_t) * grad logp_t: the correct gradient
of one token's KL(pi||pi_ref) given its prefix. But the sequence KL also
depends on y_t through the later tokens it makes likely, and its gradient
weights grad logp_t by the KL of token t *and everything after it*. The
per-token loss keeps only the s = t term: a partial gradient. Here the
partial gradient lets the policy drift much further from the reference than
beta allows.

The fix: k2 of the *sequence* log-ratio, 0.5 * (sum_t logp_t - sum_t ref_t)**2,
whose gradient is sum_t grad logp_t * sum_s logr_s (correct in expectation).

Run: python examples/token_level_k2.py  (CPU, a few seconds)
kllint reports KL003 on the `per_token_kl = ...` line of loss_token_k2;
loss_sequence_k2 is clean.
"""

from tabular import initial_policies, print_optimum, report, train, true_kl

BETA = 1.0
BATCH = 256
STEPS = 300


def loss_token_k2(per_token_logps, ref_per_token_logps, rewards, completion_mask, beta):
    advantages = rewards - (rewards.sum() - rewards) / (rewards.numel() - 1)
    pg_loss = -(advantages * (per_token_logps * completion_mask).sum(dim=1)).mean()
    per_token_kl = 0.5 * (per_token_logps - ref_per_token_logps) ** 2
    kl_loss = (per_token_kl * completion_mask).sum(dim=1).mean()
    loss = pg_loss + beta * kl_loss
    return loss


def loss_sequence_k2(per_token_logps, ref_per_token_logps, rewards, completion_mask, beta):
    advantages = rewards - (rewards.sum() - rewards) / (rewards.numel() - 1)
    pg_loss = -(advantages * (per_token_logps * completion_mask).sum(dim=1)).mean()
    seq_log_ratio = ((per_token_logps - ref_per_token_logps) * completion_mask).sum(dim=1)
    kl_loss = (0.5 * seq_log_ratio**2).mean()
    loss = pg_loss + beta * kl_loss
    return loss


def main():
    policy, ref_model = initial_policies()
    print(f"beta = {BETA}; at the start KL(pi||pi_ref) = {true_kl(policy, ref_model):.3f}")
    print(f"after {STEPS} steps of {BATCH} sequences:")
    report("k2 per token, summed (KL003)", *train(loss_token_k2, BETA, STEPS, BATCH), BETA)
    report("k2 of the sequence log-ratio", *train(loss_sequence_k2, BETA, STEPS, BATCH), BETA)
    print_optimum(ref_model, BETA)


if __name__ == "__main__":
    main()
