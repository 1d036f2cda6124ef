# Reviewer: NeMo-RL-style GRPO step with Dr. GRPO advantages (reward minus the group
# mean, no std division) and a DAPO overlong penalty. Reward shaping collects
# "penalties" and adds them to the scores; the overlong penalty is already negative,
# but the sequence KL penalty is appended as +kl_coef * seq_kl, so a sequence that
# moved further from the reference gets a *higher* reward: a KL bonus, and the loss
# that is minimised pushes KL(pi||pi_ref) up.
# Verdict: bug, KL006, on the line that computes the estimate inside the helper that
# turns it into rewards.
from typing import Optional

import torch

from nemo_rl.algorithms.loss_functions import ClippedPGLossConfig
from nemo_rl.distributed.batched_data_dict import BatchedDataDict


def overlong_penalty(lengths, max_len, buffer_len, factor=1.0):
    over = (lengths - (max_len - buffer_len)).clamp(min=0).float()
    return -factor * torch.clamp(over / buffer_len, max=1.0)


@torch.no_grad()
def compute_shaped_rewards(scores, old_logprobs, ref_logprobs, token_mask, lengths, cfg):
    penalties = []
    if cfg["overlong_buffer_len"] > 0:
        penalties.append(overlong_penalty(lengths, cfg["max_total_sequence_length"], cfg["overlong_buffer_len"]))
    if cfg["reference_policy_kl_penalty"] > 0:
        # error: KL006
        seq_kl = ((old_logprobs - ref_logprobs) * token_mask).sum(-1)
        penalties.append(cfg["reference_policy_kl_penalty"] * seq_kl)
    shaped = scores.clone()
    for p in penalties:
        shaped = shaped + p
    return shaped


@torch.no_grad()
def drgrpo_advantages(rewards, group_size):
    grouped = rewards.view(-1, group_size)
    return (grouped - grouped.mean(dim=-1, keepdim=True)).view(-1)


def clipped_pg_loss(curr_logprobs, prev_logprobs, advantages, token_mask, cfg: ClippedPGLossConfig, max_len: Optional[int] = None):
    ratios = torch.exp(curr_logprobs - prev_logprobs)
    clipped = ratios.clamp(1 - cfg["ratio_clip_min"], 1 + cfg["ratio_clip_max"])
    adv = advantages.unsqueeze(-1)
    per_token = -torch.min(ratios * adv, clipped * adv)
    denom = curr_logprobs.size(0) * (max_len or cfg["max_total_sequence_length"])
    return (per_token * token_mask).sum() / denom


def grpo_train_step(policy, batch: BatchedDataDict, cfg, optimizer):
    token_mask = batch["token_mask"]
    rewards = compute_shaped_rewards(
        batch["total_reward"], batch["prev_logprobs"], batch["reference_policy_logprobs"],
        token_mask, batch["length"], cfg,
    )
    advantages = drgrpo_advantages(rewards, cfg["num_generations_per_prompt"])
    optimizer.zero_grad()
    for mb in batch.make_microbatch_iterator(cfg["train_micro_batch_size"]):
        curr_logprobs = policy.get_logprobs(mb["input_ids"], mb["input_lengths"])
        loss = clipped_pg_loss(curr_logprobs, mb["prev_logprobs"], advantages[mb["indices"]], mb["token_mask"], cfg)
        loss.backward()
    optimizer.step()
    return {"reward": rewards.mean().item(), "advantage_abs": advantages.abs().mean().item()}
