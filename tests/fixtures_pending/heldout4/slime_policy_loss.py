"""A slime-style policy loss on packed samples (Megatron backend).

Responses of different lengths are concatenated into one flat tensor of response
tokens; ``sum_of_sample_mean`` is a callable built by the caller that averages each
sample's tokens and sums over samples. With ``--calculate-per-token-loss`` the loss
function swaps it for a closure that sums tokens and divides by the global token count.

- ``low_var_kl`` (k3, the argparse default) as a loss through either reducer: KL002;
- the sequence log-ratio (k1 of whole responses) subtracted from the reward before the
  group normalisation, no gradient: quiet.

Fixture: parsed by the tests, never executed.
"""

from __future__ import annotations

import argparse

import torch


def add_algo_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--use-kl-loss", action="store_true", default=False)
    parser.add_argument("--kl-loss-coef", type=float, default=0.0)
    parser.add_argument("--kl-loss-type", type=str, default="low_var_kl", choices=["k1", "k2", "low_var_kl"])
    parser.add_argument("--kl-coef", type=float, default=0.0, help="KL penalty in the reward")
    parser.add_argument("--calculate-per-token-loss", action="store_true", default=False)
    parser.add_argument("--eps-clip", type=float, default=0.2)
    parser.add_argument("--n-samples-per-prompt", type=int, default=8)
    return parser


def compute_approx_kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, kl_loss_type: str) -> torch.Tensor:
    log_ratio = log_probs.float() - ref_log_probs.float()
    if kl_loss_type == "k1":
        return log_ratio
    if kl_loss_type == "k2":
        return log_ratio**2 / 2.0
    if kl_loss_type == "low_var_kl":
        log_ratio = -log_ratio
        return (log_ratio.exp() - 1 - log_ratio).clamp(min=-10, max=10)
    raise ValueError(f"Unknown kl_loss_type: {kl_loss_type}")


def get_sum_of_sample_mean(response_lengths: list[int], loss_masks: list[torch.Tensor]):
    def sum_of_sample_mean(x: torch.Tensor) -> torch.Tensor:
        return sum(
            (x_i * mask_i).sum() / torch.clamp_min(mask_i.sum(), 1)
            for x_i, mask_i in zip(x.split(response_lengths, dim=0), loss_masks)
        )

    return sum_of_sample_mean


def compute_policy_loss(ppo_kl: torch.Tensor, advantages: torch.Tensor, eps_clip: float) -> torch.Tensor:
    ratio = (-ppo_kl).exp()
    pg_losses1 = -ratio * advantages
    pg_losses2 = -ratio.clamp(1 - eps_clip, 1 + eps_clip) * advantages
    return torch.maximum(pg_losses1, pg_losses2)


def policy_loss_function(args, batch, log_probs: torch.Tensor, sum_of_sample_mean):
    """Flat response tokens in; a scalar loss and logging metrics out."""
    advantages = torch.cat(batch["advantages"], dim=0)
    old_log_probs = torch.cat(batch["log_probs"], dim=0)
    loss_masks = batch["loss_masks"]

    if args.calculate_per_token_loss:
        global_num_tokens = batch["global_num_tokens"]
        flat_mask = torch.cat(loss_masks, dim=0)

        def sum_of_token(x: torch.Tensor) -> torch.Tensor:
            return (x * flat_mask).sum() / global_num_tokens

        sum_of_sample_mean = sum_of_token

    ppo_kl = old_log_probs - log_probs
    pg_loss = sum_of_sample_mean(compute_policy_loss(ppo_kl, advantages, args.eps_clip))
    metrics = {"pg_loss": pg_loss.detach()}
    loss = pg_loss

    if args.use_kl_loss:
        ref_log_probs = torch.cat(batch["ref_log_probs"], dim=0)
        # error: KL002
        kl = compute_approx_kl(log_probs, ref_log_probs, kl_loss_type=args.kl_loss_type)
        kl_loss = sum_of_sample_mean(kl)
        loss = loss + args.kl_loss_coef * kl_loss
        metrics["kl_loss"] = kl_loss.detach()
    return loss, metrics


@torch.no_grad()
def compute_grpo_rewards(args, scores: torch.Tensor, log_probs: list[torch.Tensor], ref_log_probs: list[torch.Tensor]) -> torch.Tensor:
    """Reward-side KL: the whole response's log-ratio, then a group-normalised advantage."""
    if args.kl_coef > 0:
        # ok: KL001, KL002, KL003, KL004, KL005, KL006
        seq_kl = torch.stack([(lp - rlp).sum() for lp, rlp in zip(log_probs, ref_log_probs)])
        scores = scores - args.kl_coef * seq_kl
    grouped = scores.view(-1, args.n_samples_per_prompt)
    normalised = (grouped - grouped.mean(dim=-1, keepdim=True)) / (grouped.std(dim=-1, keepdim=True) + 1e-6)
    return normalised.flatten()


def train_step(args, model, optimizer, batch):
    response_lengths = batch["response_lengths"]
    log_probs = model.packed_log_probs(batch["tokens"], response_lengths)
    reducer = get_sum_of_sample_mean(response_lengths, batch["loss_masks"])
    loss, metrics = policy_loss_function(args, batch, log_probs, reducer)
    loss.backward()
    optimizer.step()
    return metrics
