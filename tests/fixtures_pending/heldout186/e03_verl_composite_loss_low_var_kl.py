# Reviewer: verl-style actor whose loss is a weighted-sum container,
# CompositeLoss([(1.0, PPOClipLoss(...)), (kl_loss_coef, LowVarKLLoss())]).
# Each term is an nn.Module that reads what it needs from the micro-batch dict.
# LowVarKLLoss writes k3 as expm1(ref - logp) - (ref - logp) with its gradient
# and aggregates it per token ("seq-mean-token-sum-norm", a constant
# normaliser): its expected gradient is the token-level gradient of
# KL(pi_ref||pi), not grad KL(pi||pi_ref).
# Verdict: bug, KL002, reported inside LowVarKLLoss.forward (given only the batch,
# called from one place) on the line that computes the k3 estimate.
from dataclasses import dataclass

import torch
import torch.nn as nn

from verl import DataProto
from verl.utils.py_functional import append_to_dict


@dataclass
class ActorConfig:
    clip_ratio: float = 0.2
    use_kl_loss: bool = True
    kl_loss_coef: float = 0.001
    loss_agg_mode: str = "seq-mean-token-sum-norm"
    max_response_length: int = 512


def aggregate(per_token, mask, mode, norm_len):
    if mode == "token-mean":
        return (per_token * mask).sum() / mask.sum().clamp(min=1)
    if mode == "seq-mean-token-sum-norm":
        return (per_token * mask).sum(-1).mean() / norm_len
    raise ValueError(mode)


class PPOClipLoss(nn.Module):
    name = "pg_loss"

    def __init__(self, cfg: ActorConfig):
        super().__init__()
        self.cfg = cfg

    def forward(self, data):
        ratio = torch.exp(data["log_prob"] - data["old_log_probs"])
        adv = data["advantages"]
        losses = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - self.cfg.clip_ratio, 1 + self.cfg.clip_ratio))
        return aggregate(losses, data["response_mask"], self.cfg.loss_agg_mode, self.cfg.max_response_length)


class LowVarKLLoss(nn.Module):
    name = "kl_loss"

    def __init__(self, cfg: ActorConfig):
        super().__init__()
        self.cfg = cfg

    def forward(self, data):
        kl = (data["ref_log_prob"] - data["log_prob"]).clamp(min=-20.0, max=20.0)
        # error: KL002
        kld = torch.expm1(kl) - kl
        return aggregate(kld, data["response_mask"], self.cfg.loss_agg_mode, self.cfg.max_response_length)


class CompositeLoss(nn.Module):
    def __init__(self, terms):
        super().__init__()
        self.weights = [float(w) for w, _ in terms]
        self.terms = nn.ModuleList([term for _, term in terms])

    def forward(self, data):
        total, metrics = 0.0, {}
        for weight, term in zip(self.weights, self.terms):
            value = term(data)
            metrics[f"actor/{term.name}"] = value.detach().item()
            total = total + weight * value
        return total, metrics


def build_actor_loss(cfg: ActorConfig) -> CompositeLoss:
    terms = [(1.0, PPOClipLoss(cfg))]
    if cfg.use_kl_loss:
        terms.append((cfg.kl_loss_coef, LowVarKLLoss(cfg)))
    return CompositeLoss(terms)


class DataParallelPPOActor:
    def __init__(self, config: ActorConfig, actor_module, actor_optimizer):
        self.config = config
        self.actor_module = actor_module
        self.actor_optimizer = actor_optimizer
        self.loss_fn = build_actor_loss(config)

    def update_policy(self, data: DataProto):
        metrics = {}
        for mb in data.split(8):
            out = self.actor_module(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"])
            logits = out.logits[:, -mb["responses"].size(-1) - 1 : -1]
            log_prob = torch.gather(logits.log_softmax(-1), 2, mb["responses"].unsqueeze(-1)).squeeze(-1)
            loss, m = self.loss_fn({**mb, "log_prob": log_prob})
            loss.backward()
            append_to_dict(metrics, m)
        self.actor_optimizer.step()
        self.actor_optimizer.zero_grad()
        return metrics
