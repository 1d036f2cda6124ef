"""KL in the reward, credited by a reward-to-go (correct; kllint stays quiet).

The PPO/RLHF way: under torch.no_grad(), each token gets the reward
-beta * (logp_t - ref_t), the task score is added at the last token, and the
per-token rewards are turned into returns, G_t = sum_{s>=t} r_s (GAE with
gamma = 1, lambda = 1 and no critic). The policy gradient
sum_t G_t * grad logp_t then contains sum_t grad logp_t * sum_{s>=t} logr_s,
the gradient of the sequence KL(pi||pi_ref): this *is* the cumulative
estimator. (Weighting each token by its own KL reward only, without the
reward-to-go, would be partial: KL003.)

Run: python examples/kl_in_reward.py  (CPU, a few seconds)
kllint reports nothing in this file.
"""

import torch

from tabular import initial_policies, print_optimum, report, task_reward, true_kl

BETA = 1.0
BATCH = 256
STEPS = 300


def policy_gradient_loss(per_token_logps, ref_per_token_logps, scores, completion_mask, beta):
    with torch.no_grad():
        per_token_kl = per_token_logps - ref_per_token_logps
        token_rewards = -beta * per_token_kl * completion_mask
        token_rewards[:, -1] += scores
        returns = torch.flip(torch.cumsum(torch.flip(token_rewards, [1]), 1), [1])
        # Leave-one-out baseline per position: independent of the sample itself.
        advantages = returns - (returns.sum(0) - returns) / (returns.shape[0] - 1)
    loss = -(advantages * per_token_logps * completion_mask).sum(dim=1).mean()
    return loss


def train():
    policy, ref_model = initial_policies()
    optimizer = torch.optim.Adam(policy.parameters(), lr=0.08)
    generator = torch.Generator().manual_seed(123)
    for _ in range(STEPS):
        completions = policy.sample(BATCH, generator)
        completion_mask = torch.ones(completions.shape)
        per_token_logps = policy(completions)
        with torch.no_grad():
            ref_per_token_logps = ref_model(completions)
        scores = task_reward(completions)
        loss = policy_gradient_loss(per_token_logps, ref_per_token_logps, scores, completion_mask, BETA)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return policy, ref_model


def main():
    policy, ref_model = initial_policies()
    print(f"beta = {BETA}; at the start KL(pi||pi_ref) = {true_kl(policy, ref_model):.3f}")
    print(f"after {STEPS} steps of {BATCH} sequences:")
    report("k1 in the reward, reward-to-go", *train(), BETA)
    print_optimum(ref_model, BETA)


if __name__ == "__main__":
    main()
