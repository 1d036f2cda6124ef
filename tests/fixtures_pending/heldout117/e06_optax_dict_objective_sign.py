# Reviewer: loss composition ported from an optax/JAX trainer whose original
# *maximised* `objective = pg_objective - kl_coef * kl`. The port turned the
# policy-gradient part into a loss (`-pg_objective`) but kept the KL's sign
# from the objective, so the total is `pg_loss - kl_coef * kl`. The KL term
# itself is the correct score function with the reward-to-go
# (flip/cumsum/flip of the detached log-ratio).
# Verdict: BUG (KL006). The minimised loss contains -kl_coef * (a correct KL
# term): expected gradient -kl_coef * grad KL(pi||pi_ref), a KL bonus.
from dataclasses import dataclass
from typing import Dict

import torch


def sg(x: torch.Tensor) -> torch.Tensor:
    return x.detach()


def reduce_sum(x, axis=-1):
    return torch.sum(x, dim=axis)


def reverse_cumsum(x: torch.Tensor, axis: int = -1) -> torch.Tensor:
    """jnp.cumsum(x[..., ::-1], axis)[..., ::-1]"""
    return torch.flip(torch.cumsum(torch.flip(x, dims=(axis,)), dim=axis), dims=(axis,))


@dataclass
class Config:
    kl_coef: float = 0.05
    entropy_coef: float = 0.0


def loss_terms(logps, ref_logps, advantages, mask, entropy) -> Dict[str, torch.Tensor]:
    pg_objective = reduce_sum(advantages[:, None] * logps * mask).mean()
    log_ratio = sg(logps - ref_logps) * mask
    kl_to_go = reverse_cumsum(log_ratio)
    # error: KL006
    kl_term = reduce_sum(kl_to_go * logps * mask).mean()
    ent = reduce_sum(entropy * mask).mean()
    return {"pg_objective": pg_objective, "kl": kl_term, "entropy": ent, "kl_value": reduce_sum(log_ratio).mean()}


def total_loss(terms: Dict[str, torch.Tensor], cfg: Config) -> torch.Tensor:
    # JAX: objective = pg_objective - kl_coef * kl + entropy_coef * entropy;  loss = -objective
    return -terms["pg_objective"] - cfg.kl_coef * terms["kl"] - cfg.entropy_coef * terms["entropy"]


def step(model, optimizer, batch, cfg: Config):
    logits = model(batch["input_ids"]).logits[:, -batch["targets"].shape[1] - 1 : -1].float()
    logp_all = logits.log_softmax(-1)
    logps = logp_all.gather(-1, batch["targets"][..., None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    terms = loss_terms(logps, batch["ref_logps"], batch["advantages"], batch["mask"], entropy)
    loss = total_loss(terms, cfg)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return {k: float(v) for k, v in terms.items()} | {"loss": loss.item()}
