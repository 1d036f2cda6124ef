"""GRPO actor for packed micro-batches: clipped PG loss plus a KL loss to the
reference model, both reduced per sequence (sum over tokens, mean over seqs)."""
from typing import Dict

import torch

from realhf.base import stats_tracker

from .config import PPOActorConfig
from .packing import pad_packed, split_packed
from .functional import gather_logprobs, ppo_actor_loss_fn


def grpo_loss_fn(logprobs: torch.Tensor, input_data: Dict, cfg: PPOActorConfig):
    cu_seqlens = input_data["cu_seqlens"]
    loss_mask = input_data["loss_mask"].bool()
    old_logp = input_data["logprobs"]
    ref_logp = input_data["ref_logprobs"]
    advantages = input_data["advantages"]
    n_seqs = cu_seqlens.numel() - 1

    token_loss, stat = ppo_actor_loss_fn(logprobs, old_logp, advantages, cfg.eps_clip, loss_mask)
    pg_loss = token_loss.sum() / n_seqs
    loss = pg_loss
    stats = {"pg_loss": pg_loss.detach(), "clip_ratio": stat["clip_mask"].float().sum() / loss_mask.sum()}

    if cfg.kl_ctl > 0:
        # ok: KL001
        log_ratio = (logprobs - ref_logp) * loss_mask
        # one entry per sequence: sum of the log-ratio over its response tokens
        seq_log_ratio = pad_packed(log_ratio, cu_seqlens).sum(-1)
        # error: KL003
        seq_kl = 0.5 * seq_log_ratio.square()
        kl_loss = seq_kl.sum() / n_seqs
        loss = loss + cfg.kl_ctl * kl_loss
        stats["kl_loss"] = kl_loss.detach()
        stats["seq_kl_max"] = seq_kl.detach().max()
    return loss, stats


class PPOActor:
    def __init__(self, config: PPOActorConfig, engine):
        self.config = config
        self.engine = engine

    def ppo_update(self, data: Dict) -> Dict:
        all_stats = []
        for mb in self.engine.split_micro_batches(data, self.config.mb_spec):
            outputs = self.engine.forward(
                input_ids=mb["input_ids"].unsqueeze(0),
                cu_seqlens=mb["cu_seqlens"],
                max_seqlen=mb["max_seqlen"],
            )
            labels = torch.roll(mb["input_ids"], shifts=-1)
            logprobs = gather_logprobs(outputs.logits.squeeze(0), labels, self.config.temperature)
            loss, stats = grpo_loss_fn(logprobs, mb, self.config)
            loss.backward()
            stats["n_seqs"] = torch.tensor(float(len(split_packed(mb["loss_mask"], mb["cu_seqlens"]))))
            all_stats.append(stats)
        grad_norm = self.engine.clip_grad_norm(self.config.max_grad_norm)
        self.engine.optimizer_step()
        stats_tracker.scalar(grad_norm=grad_norm)
        return {k: torch.stack([s[k] for s in all_stats]).float().mean() for k in all_stats[0]}
