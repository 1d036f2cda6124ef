# Reviewer: AReaL-style PPO actor on packed 1-D inputs (cu_seqlens). The KL is
# written as a score function with a "KL-to-go" weight, computed by the file's
# segment_cumsum helper, which restarts at every cu_seqlens boundary. But the
# helper's default is a FORWARD cumulative sum, and the call does not ask for
# reverse=True: token t is weighted by sum_{s<=t} logr_s (KL so far), not
# sum_{s>=t} logr_s. The s<t terms vanish in expectation (the score of y_t has
# mean zero given the prefix), so the expected gradient is exactly the
# token-level partial gradient of KL(pi||pi_ref), not the sequence gradient.
# Verdict: bug, KL003, reported on the kl_penalty line (detached weight times logprobs).
from dataclasses import dataclass

import torch
from areal.api.cli_args import PPOActorConfig
from areal.utils.data import split_padded_tensor_dict_into_mb_list


@dataclass
class PackedKLConfig:
    kl_ctl: float = 0.1
    eps_clip: float = 0.2


def segment_cumsum(x: torch.Tensor, cu_seqlens: torch.Tensor, reverse: bool = False) -> torch.Tensor:
    """Cumulative sum of a packed 1-D tensor that restarts at every cu_seqlens boundary."""
    lens = cu_seqlens[1:] - cu_seqlens[:-1]
    seg = torch.repeat_interleave(torch.arange(lens.numel(), device=x.device), lens)
    csum = x.cumsum(0)
    before = torch.nn.functional.pad(csum, (1, 0))[cu_seqlens[:-1]]
    fwd = csum - before[seg]
    if not reverse:
        return fwd
    total = csum[cu_seqlens[1:] - 1] - before
    return total[seg] - fwd + x


def ppo_actor_loss_packed(cfg: PackedKLConfig, logprobs, old_logprobs, ref_logprobs, advantages, loss_mask, cu_seqlens):
    n_seqs = cu_seqlens.numel() - 1
    ratio = torch.exp(logprobs - old_logprobs)
    pg = -torch.min(ratio * advantages, ratio.clamp(1 - cfg.eps_clip, 1 + cfg.eps_clip) * advantages)
    pg_loss = (pg * loss_mask).sum() / n_seqs

    log_ratio = (logprobs - ref_logprobs).detach() * loss_mask
    kl_to_go = segment_cumsum(log_ratio, cu_seqlens)
    # error: KL003
    kl_penalty = (kl_to_go * logprobs * loss_mask).sum() / n_seqs
    loss = pg_loss + cfg.kl_ctl * kl_penalty
    stats = {"pg_loss": pg_loss.detach(), "kl": (log_ratio.sum() / n_seqs)}
    return loss, stats


class PackedPPOActor:
    def __init__(self, config: PPOActorConfig, engine=None):
        self.config = config
        self.engine = engine
        self.kl_cfg = PackedKLConfig()

    def ppo_update(self, data):
        all_stats = []
        for mb in split_padded_tensor_dict_into_mb_list(data, self.config.mb_spec):
            logprobs = self.engine.forward_logprobs(mb["input_ids"], cu_seqlens=mb["cu_seqlens"])
            loss, stats = ppo_actor_loss_packed(
                self.kl_cfg, logprobs, mb["logprobs"], mb["ref_logprobs"],
                mb["advantages"], mb["loss_mask"], mb["cu_seqlens"],
            )
            self.engine.backward(loss)
            all_stats.append(stats)
        self.engine.step()
        return all_stats
