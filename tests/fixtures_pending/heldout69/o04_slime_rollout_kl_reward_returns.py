# Reviewer: slime-style REINFORCE++ pipeline. Rollout-side
# `compute_advantages_and_returns` turns the KL into per-token rewards from the
# stored rollout log-probs (no gradient, by design): k1
# `compute_approx_kl(log_probs, ref_log_probs, kl_loss_type=args.kl_reward_type)`,
# `rewards = -kl_coef * kl`, the task reward added on the last token, and the
# returns taken as a masked reverse cumulative sum (gamma = 1). The training
# loss reads the returns and uses the `sum_of_sample_mean` reducer, reassigned
# to a per-token-sum closure by `--calculate-per-token-loss` (default on).
# Verdict: CORRECT. A detached k1 reward credited by returns gives the KL part
# of the gradient -kl_coef * grad KL(pi||pi_ref) of the objective, i.e. the loss
# has gradient +kl_coef * grad KL(pi||pi_ref).
from argparse import Namespace

import torch
from megatron.core import mpu


def compute_approx_kl(log_probs, ref_log_probs, kl_loss_type="k3"):
    log_ratio = log_probs - ref_log_probs
    if kl_loss_type == "k1":
        return log_ratio
    if kl_loss_type == "k2":
        return log_ratio.square() / 2
    if kl_loss_type in ("k3", "low_var_kl"):
        return (-log_ratio).exp() - 1 + log_ratio
    raise ValueError(kl_loss_type)


def gather_log_probs(logits, tokens, temperature=1.0):
    return torch.log_softmax(logits / temperature, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


@torch.no_grad()
def compute_advantages_and_returns(args: Namespace, rollout: dict):
    log_probs, ref_log_probs, loss_masks = rollout["log_probs"], rollout["ref_log_probs"], rollout["loss_masks"]
    # ok: KL005
    kl = compute_approx_kl(log_probs, ref_log_probs, kl_loss_type=args.kl_reward_type)
    # ok: KL006
    rewards = -args.kl_coef * kl * loss_masks
    last = loss_masks.sum(-1).long() - 1
    rewards[torch.arange(rewards.size(0)), last] += rollout["rewards"]
    returns = (rewards.flip(-1).cumsum(-1).flip(-1)) * loss_masks
    rollout["advantages"] = returns
    rollout["returns"] = returns
    return rollout


def get_sum_of_sample_mean(loss_masks):
    def sum_of_sample_mean(x):
        return ((x * loss_masks).sum(-1) / loss_masks.sum(-1).clamp(min=1)).sum()
    return sum_of_sample_mean


def policy_loss_function(args: Namespace, batch: dict, logits, sum_of_sample_mean):
    log_probs = gather_log_probs(logits, batch["tokens"], args.rollout_temperature)
    ratio = (log_probs - batch["log_probs"]).exp()
    adv = batch["advantages"]
    pg_loss = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - args.eps_clip, 1 + args.eps_clip_high))
    pg_loss = sum_of_sample_mean(pg_loss)
    return pg_loss, {"pg_loss": pg_loss.detach()}


def loss_function(args: Namespace, batch: dict, num_microbatches: int, logits):
    loss_masks = batch["loss_masks"]
    sum_of_sample_mean = get_sum_of_sample_mean(loss_masks)
    if args.calculate_per_token_loss:
        def sum_of_token(x):
            return (x * loss_masks).sum()
        sum_of_sample_mean = sum_of_token
    loss, log = policy_loss_function(args, batch, logits, sum_of_sample_mean)
    if not args.calculate_per_token_loss:
        loss = loss * num_microbatches / args.global_batch_size * mpu.get_data_parallel_world_size()
    return loss, {"keys": list(log.keys()), "values": torch.stack(list(log.values()))}


def default_args(**overrides) -> Namespace:
    args = Namespace(rollout_temperature=1.0, eps_clip=0.2, eps_clip_high=0.28, kl_reward_type="k1",
                     kl_coef=0.01, calculate_per_token_loss=True, global_batch_size=256)
    for k, v in overrides.items():
        setattr(args, k, v)
    return args
