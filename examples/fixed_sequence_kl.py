"""The correct KL(pi||pi_ref) gradient for sequences, three ways (all clean).

For y = y_1..y_T sampled from pi, with logr_t = logp_t - ref_t,

    grad KL(pi||pi_ref) = E[ sum_t grad logp_t * sum_{s>=t} logr_s ],

each token's score weighted by the reward-to-go of the log-ratio. This file
writes that gradient as

  1. a score function with the reward-to-go G_t = sum_{s>=t} sg(logr_s),
  2. the value-preserving surrogate sg(k3) + G_t * (logp_t - sg(logp_t)): it
     logs the k3 value people are used to and has the gradient of (1),
  3. k2 of the *sequence* log-ratio, 0.5 * (sum_t logr_t)**2 (its gradient adds
     terms with logr_s, s < t, that are zero in expectation),

checks by exact enumeration of all 256 sequences that each one's expected
gradient equals grad KL(pi||pi_ref), then trains with each.

Run: python examples/fixed_sequence_kl.py  (CPU, a few seconds)
kllint reports nothing in this file.
"""

import torch

from tabular import (
    compare,
    exact_expected_gradient,
    initial_policies,
    print_optimum,
    report,
    task_reward,
    true_kl,
    true_kl_gradient,
)

BETA = 1.0
BATCH = 256
STEPS = 300


def kl_score_function(per_token_logps, ref_per_token_logps, completion_mask):
    log_ratio = (per_token_logps - ref_per_token_logps).detach() * completion_mask
    kl_to_go = torch.flip(torch.cumsum(torch.flip(log_ratio, [1]), 1), [1])
    return (kl_to_go * per_token_logps * completion_mask).sum(dim=1)


def kl_value_preserving(per_token_logps, ref_per_token_logps, completion_mask):
    log_ratio = (per_token_logps - ref_per_token_logps).detach() * completion_mask
    kl_to_go = log_ratio.flip(-1).cumsum(-1).flip(-1)
    k3_value = torch.exp(-log_ratio) + log_ratio - 1
    per_token_kl = k3_value + kl_to_go * (per_token_logps - per_token_logps.detach())
    return (per_token_kl * completion_mask).sum(dim=1)


def kl_sequence_k2(per_token_logps, ref_per_token_logps, completion_mask):
    seq_log_ratio = ((per_token_logps - ref_per_token_logps) * completion_mask).sum(dim=1)
    return 0.5 * seq_log_ratio**2


SURROGATES = {
    "score function, reward-to-go": kl_score_function,
    "value-preserving surrogate": kl_value_preserving,
    "k2 of the sequence log-ratio": kl_sequence_k2,
}


def train(kl_surrogate):
    policy, ref_model = initial_policies()
    optimizer = torch.optim.Adam(policy.parameters(), lr=0.08)
    generator = torch.Generator().manual_seed(123)
    for _ in range(STEPS):
        completions = policy.sample(BATCH, generator)
        completion_mask = torch.ones(completions.shape)
        per_token_logps = policy(completions)
        with torch.no_grad():
            ref_per_token_logps = ref_model(completions)
        rewards = task_reward(completions)
        advantages = rewards - (rewards.sum() - rewards) / (rewards.numel() - 1)
        pg_loss = -(advantages * (per_token_logps * completion_mask).sum(dim=1)).mean()
        kl_loss = kl_surrogate(per_token_logps, ref_per_token_logps, completion_mask).mean()
        loss = pg_loss + BETA * kl_loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return policy, ref_model


def main():
    policy, ref_model = initial_policies()
    print(f"exact expected gradient vs grad KL(pi||pi_ref), at KL(pi||pi_ref) = {true_kl(policy, ref_model):.3f}:")
    target = true_kl_gradient(policy, ref_model)
    for name, surrogate in SURROGATES.items():
        compare(name, exact_expected_gradient(policy, ref_model, surrogate), target)
    print(f"beta = {BETA}; after {STEPS} steps of {BATCH} sequences:")
    for name, surrogate in SURROGATES.items():
        report(name, *train(surrogate), BETA)
    print_optimum(ref_model, BETA)


if __name__ == "__main__":
    main()
