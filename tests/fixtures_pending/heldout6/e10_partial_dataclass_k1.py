"""functools.partial binds the estimator from a dataclass config; log-probs via logsumexp; k1 reaches the loss."""
import functools
from dataclasses import dataclass, field

import torch


@dataclass
class KLConfig:
    estimator: str = "k1"
    coef: float = 0.05


@dataclass
class TrainConfig:
    lr: float = 1e-6
    kl: KLConfig = field(default_factory=KLConfig)


def compute_approx_kl(log_probs, ref_log_probs, estimator="k1"):
    log_ratio = log_probs.float() - ref_log_probs.float()
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return log_ratio.pow(2) / 2.0
    if estimator == "k3":
        return (-log_ratio).exp() - 1 + log_ratio
    raise ValueError(estimator)


def gather_logprobs(logits, labels):
    return logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def make_loss_fn(cfg: TrainConfig):
    kl_fn = functools.partial(compute_approx_kl, estimator=cfg.kl.estimator)
    seq_sum = lambda x, m: (x * m).sum(dim=-1)  # noqa: E731

    def loss_fn(logits, ref_logits, labels, mask, advantages):
        logp = gather_logprobs(logits, labels)
        ref_logp = gather_logprobs(ref_logits, labels).detach()
        pg_loss = -(advantages * seq_sum(logp, mask)).mean()
        # error: KL001
        kl = seq_sum(kl_fn(logp, ref_logp), mask).mean()
        return pg_loss + cfg.kl.coef * kl, kl.detach()

    return loss_fn


def train(model, ref_model, loader, cfg: TrainConfig = TrainConfig()):
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    loss_fn = make_loss_fn(cfg)
    for batch in loader:
        logits = model(batch["input_ids"]).logits[:, :-1]
        with torch.no_grad():
            ref_logits = ref_model(batch["input_ids"]).logits[:, :-1]
        loss, kl = loss_fn(logits, ref_logits, batch["input_ids"][:, 1:], batch["mask"], batch["advantages"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
