# Reviewer: NeMo-RL-style advantage computation (rollout side, no gradient).
# GRPO's sequence advantage (reward minus the group mean, leave-one-out) is
# broadcast over the response tokens, and the per-token KL penalty is
# subtracted from it: `adv_t = seq_adv - kl_coef * kl_t`, with
# kl_t = generation log-prob minus reference log-prob (k1, detached). The
# result is stored in the batch as "advantages"; loss_functions.py reads it.
# Verdict: BUG, KL003. Each token's KL reward weights only its own token's
# log-prob (no reward-to-go): the KL part of the expected gradient is the
# token-level partial gradient of KL(pi||pi_ref), not the sequence's. The
# helper makes the estimate into advantages, so it is reported here.
import torch


def calculate_baseline_and_std_per_prompt(prompt_ids, rewards, leave_one_out_baseline=True):
    baseline = torch.zeros_like(rewards)
    std = torch.ones_like(rewards)
    for pid in prompt_ids.unique():
        idx = (prompt_ids == pid).nonzero(as_tuple=True)[0]
        group = rewards[idx]
        n = group.numel()
        if leave_one_out_baseline and n > 1:
            baseline[idx] = (group.sum() - group) / (n - 1)
        else:
            baseline[idx] = group.mean()
        if n > 1:
            std[idx] = group.std()
    return baseline, std


@torch.no_grad()
def compute_kl_penalized_advantages(rewards, prompt_ids, generation_logprobs, reference_logprobs, token_mask,
                                    kl_coef: float, normalize_rewards: bool = False):
    baseline, std = calculate_baseline_and_std_per_prompt(prompt_ids, rewards)
    seq_adv = rewards - baseline
    if normalize_rewards:
        seq_adv = seq_adv / (std + 1e-6)
    # error: KL003
    kl_per_token = (generation_logprobs - reference_logprobs) * token_mask
    advantages = seq_adv.unsqueeze(-1).expand_as(kl_per_token) - kl_coef * kl_per_token
    metrics = {"kl_penalty": (kl_per_token.sum(-1)).mean().item(), "baseline_reward": baseline.mean().item()}
    return advantages * token_mask, metrics
