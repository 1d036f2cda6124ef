"""Value-model PPO for an LM policy with Accelerate, CleanRL style.

The KL to the reference is a per-token reward, credited by returns (GAE with
gamma = lambda = 1 against a learned value baseline). Inside the update,
``approx_kl`` between the rollout policy and the current one (Schulman's k3
of the importance ratio) stops the epoch loop early once the policy has
moved too far from the one that collected the data.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class PPOArgs:
    kl_coef: float = 0.05
    clip_coef: float = 0.2
    vf_coef: float = 0.5
    update_epochs: int = 4
    target_kl: float = 0.02
    max_grad_norm: float = 1.0


def gather_logprobs(logits, tokens):
    return F.log_softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def masked_mean(x, mask):
    return (x * mask).sum() / mask.sum()


@torch.no_grad()
def rollout(policy, ref_policy, value_model, reward_fn, prompt_ids, response_ids, response_mask, kl_coef):
    seq = torch.cat([prompt_ids, response_ids], dim=1)
    p = prompt_ids.shape[1]
    logp = gather_logprobs(policy(seq).logits[:, p - 1 : -1], response_ids)
    ref_logp = gather_logprobs(ref_policy(seq).logits[:, p - 1 : -1], response_ids)
    values = value_model(seq)[:, p - 1 : -1]
    scores = reward_fn(seq)

    # ok: KL001
    kl = logp - ref_logp
    rewards = -kl_coef * kl * response_mask
    last = response_mask.sum(-1).long() - 1
    rewards[torch.arange(rewards.size(0)), last] += scores

    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(scores)
    for t in reversed(range(rewards.size(1))):
        running = rewards[:, t] + running
        returns[:, t] = running
    advantages = (returns - values) * response_mask
    return {
        "seq": seq,
        "response_ids": response_ids,
        "mask": response_mask,
        "old_logp": logp,
        "old_values": values,
        "advantages": advantages,
        "returns": returns,
        "kl": (kl * response_mask).sum(-1).mean(),
    }


def ppo_update(accelerator, policy, value_model, optimizer, minibatches, args: PPOArgs):
    stats = {"approx_kl": 0.0, "epochs": 0}
    for epoch in range(args.update_epochs):
        for mb in minibatches:
            p = mb["seq"].shape[1] - mb["response_ids"].shape[1]
            logits = policy(mb["seq"]).logits[:, p - 1 : -1]
            new_logp = gather_logprobs(logits, mb["response_ids"])
            new_values = value_model(mb["seq"])[:, p - 1 : -1]

            log_ratio = new_logp - mb["old_logp"]
            ratio = log_ratio.exp()
            # ok: KL002
            approx_kl = masked_mean((ratio - 1) - log_ratio, mb["mask"])

            pg_loss1 = -mb["advantages"] * ratio
            pg_loss2 = -mb["advantages"] * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
            pg_loss = masked_mean(torch.max(pg_loss1, pg_loss2), mb["mask"])
            v_loss = 0.5 * masked_mean((new_values - mb["returns"]) ** 2, mb["mask"])
            loss = pg_loss + args.vf_coef * v_loss

            optimizer.zero_grad()
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(policy.parameters(), args.max_grad_norm)
            optimizer.step()
            stats["approx_kl"] = approx_kl.item()
        stats["epochs"] = epoch + 1
        if args.target_kl is not None and stats["approx_kl"] > 1.5 * args.target_kl:
            break
    return stats
