# Reviewer: a user's Megatron-backed GRPO loss (pipeline output time-major,
# [T, B*G]). The log-probs are rearranged to [B, G, T] and the log-ratio is
# reduced over time to one number per response (right axis), and the KL loss
# is the k3 of that sequence log-ratio, expm1(-x) + x = exp(-x) - 1 + x, with
# gradient. Differentiated, sequence k3 gives (1 - pi_ref(y)/pi(y)) grad
# log pi(y), whose expectation is grad KL(pi_ref||pi) of the sequence: the
# swapped divergence. Summing first fixes the partial-gradient problem of
# per-token k3 but not the direction.
# Verdict: bug, KL002, reported on the k3 line.
import torch
from einops import rearrange, reduce
from megatron.core import parallel_state as mpu  # noqa: F401


def grpo_time_major_loss(logprobs_tm, old_logprobs_tm, ref_logprobs_tm, loss_mask_tm, advantages, n_group, kl_coef, eps_clip=0.2):
    T = logprobs_tm.shape[0]
    lp = rearrange(logprobs_tm, "t (b g) -> b g t", g=n_group)
    old_lp = rearrange(old_logprobs_tm, "t (b g) -> b g t", g=n_group)
    ref_lp = rearrange(ref_logprobs_tm, "t (b g) -> b g t", g=n_group)
    mask = rearrange(loss_mask_tm, "t (b g) -> b g t", g=n_group).float()
    adv = rearrange(advantages, "(b g) -> b g 1", g=n_group)

    ratio = torch.exp(lp - old_lp)
    pg = -torch.min(ratio * adv, ratio.clamp(1 - eps_clip, 1 + eps_clip) * adv)
    pg_loss = reduce(pg * mask, "b g t -> b", "sum").mean() / (n_group * T)

    seq_log_ratio = reduce((lp - ref_lp) * mask, "b g t -> b g", "sum")
    # error: KL002
    seq_kl = torch.expm1(-seq_log_ratio) + seq_log_ratio
    kl_loss = seq_kl.mean()
    loss = pg_loss + kl_coef * kl_loss

    metrics = {
        "pg_loss": pg_loss.item(),
        "seq_kl": kl_loss.item(),
        "resp_len": reduce(mask, "b g t -> b g", "sum").mean().item(),
    }
    return loss, metrics


def loss_func(output_tensor, batch, args):
    """Megatron forward_step callback: output_tensor holds the [T, B*G] log-probs."""
    loss, metrics = grpo_time_major_loss(
        output_tensor,
        batch["old_logprobs"],
        batch["ref_logprobs"],
        batch["loss_mask"],
        batch["advantages"],
        n_group=args.n_samples_per_prompt,
        kl_coef=args.kl_coef,
        eps_clip=args.eps_clip,
    )
    num_tokens = batch["loss_mask"].sum().clamp(min=1)
    return loss, num_tokens, metrics
