# Reviewer: ROLL-style actor worker. The KL estimators are lambdas stored in a
# tuple of (name, fn) pairs and looked up with dict(); the default
# PipelineConfig.kl_estimator is "k3". The estimator is mapped over the
# micro-batch chunks with itertools.starmap, concatenated, and the per-token k3
# (with gradient) is summed over the response and added to the loss: its
# expected gradient is the token-level gradient of KL(pi_ref||pi).
# Verdict: bug, KL002, reported on the starmap line that calls the estimator
# from the loss.
import itertools
from dataclasses import dataclass

import torch

from roll.distributed.scheduler.protocol import DataProto
from roll.pipeline.base_worker import ActorWorker as BaseActorWorker

KL_ESTIMATORS = (
    # ok: KL001
    ("k1", lambda lp, ref: lp - ref),
    ("k2", lambda lp, ref: 0.5 * (lp - ref).square()),
    # ok: KL002
    ("k3", lambda lp, ref: torch.exp(ref - lp) - (ref - lp) - 1),
)


@dataclass
class PipelineConfig:
    use_kl_loss: bool = True
    kl_loss_coef: float = 0.01
    kl_estimator: str = "k3"
    pg_clip: float = 0.2
    kl_chunk_size: int = 2


class ActorWorker(BaseActorWorker):
    def __init__(self, pipeline_config: PipelineConfig):
        self.pipeline_config = pipeline_config
        self.kl_fn = dict(KL_ESTIMATORS)[pipeline_config.kl_estimator]

    def loss_func(self, data: DataProto, log_probs: torch.Tensor):
        cfg = self.pipeline_config
        response_mask = data.batch["response_mask"]
        old_log_probs = data.batch["old_log_probs"]
        ref_log_probs = data.batch["ref_log_probs"]
        advantages = data.batch["advantages"]

        ratio = (log_probs - old_log_probs).exp()
        surr = torch.min(ratio * advantages, ratio.clamp(1 - cfg.pg_clip, 1 + cfg.pg_clip) * advantages)
        pg_loss = -(surr * response_mask).sum(-1).mean()
        metrics = {"actor/pg_loss": pg_loss.item()}

        total_loss = pg_loss
        if cfg.use_kl_loss:
            chunks = zip(log_probs.split(cfg.kl_chunk_size), ref_log_probs.split(cfg.kl_chunk_size))
            # error: KL002
            kl = torch.cat(list(itertools.starmap(self.kl_fn, chunks)))
            kl_loss = (kl * response_mask).sum(-1).mean()
            total_loss = total_loss + cfg.kl_loss_coef * kl_loss
            metrics["actor/kl_loss"] = kl_loss.item()
        return total_loss, metrics

    def train_step(self, data: DataProto, model, optimizer):
        model.train()
        responses = data.batch["responses"]
        logits = model(input_ids=data.batch["input_ids"], attention_mask=data.batch["attention_mask"]).logits
        logits = logits[:, -responses.shape[-1] - 1 : -1]
        log_probs = torch.gather(logits.log_softmax(-1), -1, responses.unsqueeze(-1)).squeeze(-1)
        loss, metrics = self.loss_func(data, log_probs)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return metrics
