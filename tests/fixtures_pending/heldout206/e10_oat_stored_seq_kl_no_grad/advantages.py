"""Learner-side preprocessing of a rollout batch (no gradient)."""
import torch


@torch.no_grad()
def compute_advantages(batch: dict, args) -> dict:
    """Advantages per response, and the KL statistics the loss reuses."""
    mask = batch["response_mask"]
    logps = batch["logps"]
    ref_logps = batch["ref_logps"]
    rewards = batch["rewards"]

    advantages = rewards - args.reward_baseline
    batch["advantages"] = advantages.unsqueeze(-1) * mask

    # k2 of the sequence log-ratio: 0.5 * (sum_t logr_t)^2
    # error: KL005
    batch["kl"] = 0.5 * ((logps - ref_logps) * mask).sum(-1).pow(2)
    batch["log_ratio"] = (logps - ref_logps) * mask
    return batch


def summarize(batch: dict) -> dict:
    return {
        "kl/seq_k2": batch["kl"].mean().item(),
        "kl/seq_k1": batch["log_ratio"].sum(-1).mean().item(),
        "adv/mean": batch["advantages"].mean().item(),
    }
