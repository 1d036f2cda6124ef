# Reviewer: slime-style policy loss with a score-function KL over reasoning steps. The
# detached log-ratio is summed per step (scatter_add), accumulated over steps with
# torch.cumsum, gathered back to each token by its step index and multiplied by the
# token log-probs. But cumsum along the step axis is a PREFIX sum: token t of step k is
# weighted by the KL of steps 1..k, not k..K. The earlier steps' KL has zero expected
# effect, the later steps' KL is missing; what remains is the within-step part
# sum_{s in step(t), s >= t} x_s, a partial gradient of the sequence KL(pi||pi_ref).
# Verdict: bug, KL003, reported on the `kl_penalty = ...` line that multiplies the
# detached weight by the log-probs.
import torch

from slime.utils.ppo_utils import compute_policy_loss
from slime.utils.distributed_utils import distributed_masked_whiten


def step_index(tokens: torch.Tensor, loss_mask: torch.Tensor, step_token_id: int, num_steps: int) -> torch.Tensor:
    ends = (tokens == step_token_id).long() * loss_mask.long()
    return (torch.cumsum(ends, dim=-1) - ends).clamp(max=num_steps - 1)


def policy_loss_function(args, batch, log_probs: torch.Tensor):
    loss_mask = batch["loss_mask"]
    old_log_probs = batch["log_probs"]
    ref_log_probs = batch["ref_log_probs"]
    advantages = batch["advantages"]
    step_idx = step_index(batch["tokens"], loss_mask, args.step_token_id, args.num_steps)

    ppo_kl = old_log_probs - log_probs
    ratio = torch.exp(-ppo_kl)
    pg_losses1 = -ratio * advantages
    pg_losses2 = -ratio.clamp(1 - args.eps_clip, 1 + args.eps_clip_high) * advantages
    pg_loss = (torch.maximum(pg_losses1, pg_losses2) * loss_mask).sum(-1).mean()

    log_ratio = (log_probs - ref_log_probs).detach() * loss_mask
    step_log_ratio = torch.zeros(log_ratio.shape[0], args.num_steps, dtype=log_ratio.dtype).scatter_add(1, step_idx, log_ratio)
    step_kl_to_go = torch.cumsum(step_log_ratio, dim=-1)
    token_kl_to_go = torch.gather(step_kl_to_go, 1, step_idx)
    # error: KL003
    kl_penalty = (token_kl_to_go * log_probs * loss_mask).sum(-1).mean()

    loss = pg_loss + args.kl_loss_coef * kl_penalty
    log = {
        "pg_loss": pg_loss.detach(),
        "kl": log_ratio.sum(-1).mean(),
        "ppo_kl": (ppo_kl * loss_mask).sum(-1).mean().detach(),
    }
    return loss, log
