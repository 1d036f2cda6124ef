# Reviewer: the worker resolves self.kl_fn once, from the registry, and adds it to the
# loss in loss_func: with the default "low_var_kl" that is KL002 at `kl = self.kl_fn(...)`.
"""Actor worker: the PPO loss with a KL loss term."""

import torch

from roll.distributed.scheduler.protocol import DataProto

from . import estimators  # noqa: F401  (registers the estimators)
from .config import PPOConfig
from .registry import get_kl_estimator


class ActorWorker:
    def __init__(self, pipeline_config: PPOConfig | None = None):
        self.pipeline_config = pipeline_config or PPOConfig()
        self.kl_fn = get_kl_estimator(self.pipeline_config.kl_loss_type)

    def loss_func(self, data: DataProto, log_probs: torch.Tensor):
        response_mask = data.batch["response_mask"][:, 1:].float()
        old_log_probs = data.batch["old_log_probs"]
        ref_log_probs = data.batch["ref_log_probs"]
        advantages = data.batch["advantages"]

        ratio = (log_probs - old_log_probs).exp()
        pg_clip = self.pipeline_config.pg_clip
        surr1 = ratio * advantages
        surr2 = ratio.clamp(1 - pg_clip, 1 + pg_clip) * advantages
        pg_loss = (-torch.min(surr1, surr2) * response_mask).sum(dim=-1).mean()

        total_loss = pg_loss
        metrics = {"actor/pg_loss": pg_loss.detach().item()}
        if self.pipeline_config.use_kl_loss:
            # error: KL002
            kl = self.kl_fn(log_probs, ref_log_probs, response_mask)
            kl_loss = kl.mean()
            total_loss = total_loss + self.pipeline_config.init_kl_coef * kl_loss
            metrics["actor/kl_loss"] = kl_loss.detach().item()
        return total_loss, metrics
