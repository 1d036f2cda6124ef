# Reviewer: open-instruct-style PPO with a value model. During rollout
# processing (`torch.no_grad()`), the per-token KL of each response is computed
# from the rollout log-probs and the reference (`kl_estimator="kl2"` here, the
# k2 of the sequence log-ratio) and stored in the batch. Because
# `kl_in_reward=False` (the default), the rewards are the scores only and the
# stored `kl` is instead added to the actor loss in the training step: a value
# computed under no_grad, so the regulariser contributes exactly zero gradient.
# Verdict: bug, KL005, reported where the stored KL is computed under no_grad.
import argparse

import torch

from open_instruct.model_utils import get_reward, first_true_indices
from open_instruct.utils import ArgumentParserPlus


def parse_args(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--beta", type=float, default=0.05)
    parser.add_argument("--gamma", type=float, default=1.0)
    parser.add_argument("--lam", type=float, default=1.0)
    parser.add_argument("--cliprange", type=float, default=0.2)
    parser.add_argument("--cliprange_value", type=float, default=0.2)
    parser.add_argument("--vf_coef", type=float, default=0.1)
    parser.add_argument("--kl_in_reward", action="store_true", default=False)
    return parser.parse_args([] if argv is None else argv)


def masked_sum(x, mask, axis=-1):
    return (x * mask).sum(axis)


@torch.no_grad()
def process_rollouts(args, logprobs, ref_logprobs, values, scores, response_mask):
    seq_logratio = masked_sum(logprobs - ref_logprobs, response_mask)
    # error: KL005
    kl = 0.5 * seq_logratio ** 2
    rewards = torch.zeros_like(values)
    last = response_mask.sum(1).long() - 1
    rewards[torch.arange(rewards.shape[0]), last] = scores
    if args.kl_in_reward:
        rewards[torch.arange(rewards.shape[0]), last] -= args.beta * seq_logratio
    values = values * response_mask
    lastgaelam = 0
    advantages_reversed = []
    gen_length = rewards.shape[1]
    for t in reversed(range(gen_length)):
        nextvalues = values[:, t + 1] if t < gen_length - 1 else 0.0
        delta = rewards[:, t] + args.gamma * nextvalues - values[:, t]
        lastgaelam = delta + args.gamma * args.lam * lastgaelam
        advantages_reversed.append(lastgaelam)
    advantages = torch.stack(advantages_reversed[::-1], axis=1)
    returns = advantages + values
    return {"logprobs": logprobs, "advantages": advantages, "returns": returns,
            "values": values, "kl": kl, "response_mask": response_mask}


def ppo_loss(args, batch, new_logprobs, vpred):
    mask = batch["response_mask"]
    ratio = torch.exp(new_logprobs - batch["logprobs"])
    pg_losses = -batch["advantages"] * ratio
    pg_losses2 = -batch["advantages"] * torch.clamp(ratio, 1.0 - args.cliprange, 1.0 + args.cliprange)
    pg_loss = masked_sum(torch.max(pg_losses, pg_losses2), mask).mean()
    vpredclipped = torch.clamp(vpred, batch["values"] - args.cliprange_value, batch["values"] + args.cliprange_value)
    vf_loss = 0.5 * masked_sum(torch.max((vpred - batch["returns"]) ** 2, (vpredclipped - batch["returns"]) ** 2), mask).mean()
    loss = pg_loss + args.vf_coef * vf_loss
    if not args.kl_in_reward:
        loss = loss + args.beta * batch["kl"].mean()
    return loss, {"pg_loss": pg_loss.item(), "vf_loss": vf_loss.item(), "kl": batch["kl"].mean().item()}


def train_step(model, value_model, optimizer, args, batch):
    logits = model(batch["query_responses"]).logits[:, batch["context_length"] - 1 : -1]
    new_logprobs = torch.gather(logits.log_softmax(-1), 2, batch["responses"].unsqueeze(-1)).squeeze(-1)
    vpred = value_model(batch["query_responses"]).squeeze(-1)[:, batch["context_length"] - 1 : -1]
    loss, stats = ppo_loss(args, batch, new_logprobs, vpred)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return stats
