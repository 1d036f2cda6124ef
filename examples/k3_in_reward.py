"""KL004 (k3-estimate-as-reward): the k3 estimate used as the KL reward, next
to its fix (k1 in the reward).

A reward is differentiated only through the score function: the gradient of a
reward sg(k3) is E[k3 * grad logp] (per token, credited by the reward-to-go).
That is the gradient of E[k3] holding the k3 values fixed, i.e.
grad KL(pi||pi_ref) minus the part autograd would get through k3 itself, the
(per-token) gradient of KL(pi_ref||pi). Near the reference the two agree to
first order and the KL reward pushes almost nothing; here the policy runs off
to the reward-maximising sequence. The same code with the log-ratio k1 as the
reward is the correct cumulative estimator (see kl_in_reward.py).

Run: python examples/k3_in_reward.py  (CPU, a few seconds)
kllint reports KL004 on the `per_token_kl = ...` line of loss_k3_reward;
loss_k1_reward is clean.
"""

import torch

from tabular import initial_policies, print_optimum, report, train, true_kl

BETA = 1.0
BATCH = 256
STEPS = 300


def loss_k3_reward(per_token_logps, ref_per_token_logps, scores, completion_mask, beta):
    with torch.no_grad():
        per_token_kl = torch.exp(ref_per_token_logps - per_token_logps) - (ref_per_token_logps - per_token_logps) - 1
        token_rewards = -beta * per_token_kl * completion_mask
        token_rewards[:, -1] += scores
        returns = torch.flip(torch.cumsum(torch.flip(token_rewards, [1]), 1), [1])
        advantages = returns - (returns.sum(0) - returns) / (returns.shape[0] - 1)
    loss = -(advantages * per_token_logps * completion_mask).sum(dim=1).mean()
    return loss


def loss_k1_reward(per_token_logps, ref_per_token_logps, scores, completion_mask, beta):
    with torch.no_grad():
        per_token_kl = per_token_logps - ref_per_token_logps
        token_rewards = -beta * per_token_kl * completion_mask
        token_rewards[:, -1] += scores
        returns = torch.flip(torch.cumsum(torch.flip(token_rewards, [1]), 1), [1])
        advantages = returns - (returns.sum(0) - returns) / (returns.shape[0] - 1)
    loss = -(advantages * per_token_logps * completion_mask).sum(dim=1).mean()
    return loss


def main():
    policy, ref_model = initial_policies()
    print(f"beta = {BETA}; at the start KL(pi||pi_ref) = {true_kl(policy, ref_model):.3f}")
    print(f"after {STEPS} steps of {BATCH} sequences:")
    report("k3 in the reward (KL004)", *train(loss_k3_reward, BETA, STEPS, BATCH), BETA)
    report("k1 in the reward (fixed)", *train(loss_k1_reward, BETA, STEPS, BATCH), BETA)
    print_optimum(ref_model, BETA)


if __name__ == "__main__":
    main()
