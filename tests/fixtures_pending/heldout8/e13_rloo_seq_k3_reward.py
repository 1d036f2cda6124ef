"""RLOO with the k3 estimate of the sequence KL subtracted from the reward (bug: KL004).

The reward of each completion is score - beta * k3(L) with L the sequence
log-ratio sum_t (logp_t - ref_logp_t), computed without gradient, and the
leave-one-out advantage weights log pi(y). A reward is differentiated only
through the score function, so the KL part of the gradient is
-beta * E[k3(L) grad log pi(y)] = -beta * (grad KL(pi||pi_ref) - grad KL(pi_ref||pi)),
nearly zero near the reference and biased far from it. With k1 (L itself) in
the reward it would be -beta * grad KL(pi||pi_ref).
"""

import torch


class RLOOTrainerStep:
    def __init__(self, policy, ref_policy, reward_model, optimizer, rloo_k=4, kl_coef=0.05):
        self.policy = policy
        self.ref_policy = ref_policy
        self.reward_model = reward_model
        self.optimizer = optimizer
        self.rloo_k = rloo_k
        self.kl_coef = kl_coef

    @torch.no_grad()
    def rewards(self, queries, responses, logprobs, ref_logprobs, padding_mask):
        log_ratio = ((logprobs - ref_logprobs) * padding_mask).sum(1)
        # error: KL004
        seq_kl = torch.expm1(-log_ratio) + log_ratio
        scores = self.reward_model(queries, responses)
        return scores - self.kl_coef * seq_kl, seq_kl

    def step(self, queries, responses, padding_mask):
        logprobs = self.policy.logprobs(queries, responses)
        with torch.no_grad():
            ref_logprobs = self.ref_policy.logprobs(queries, responses)
        rlhf_reward, seq_kl = self.rewards(queries, responses, logprobs.detach(), ref_logprobs, padding_mask)

        # rloo_k samples per query, laid out [k, B]
        rlhf_reward = rlhf_reward.reshape(self.rloo_k, -1)
        baseline = (rlhf_reward.sum(0) - rlhf_reward) / (self.rloo_k - 1)
        advantages = (rlhf_reward - baseline).flatten()

        seq_logprobs = (logprobs * padding_mask).sum(1)
        loss = -(advantages * seq_logprobs).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {"objective/kl": seq_kl.mean().item(), "loss/policy": loss.item()}
