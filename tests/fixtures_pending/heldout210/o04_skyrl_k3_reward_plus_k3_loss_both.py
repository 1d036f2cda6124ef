# Reviewer: SkyRL-style policy worker, same skeleton as e04 with the same k3 helper
# kl_penalty_term(). Both KL placements run by default with the same coefficient: the
# no_grad compute_returns() puts -kl_loss_coef * k3 into the per-token rewards and takes
# returns (reverse cumsum), and the loss adds kl_loss_coef * k3 with its gradient, both
# reduced by the same constant. Reward half: c*(grad KL(pi||pi_ref) - token-level
# grad KL(pi_ref||pi)); loss half: c * that token-level term. Their sum is c * grad
# KL(pi||pi_ref) of the sequence (the "both" pairing of the rule book).
# Verdict: correct. Neither k3 call is reported.
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from skyrl_train.utils import Timer
from skyrl_train.workers.worker import PolicyWorkerBase


@dataclass
class AlgorithmConfig:
    use_kl_loss: bool = True
    use_kl_in_reward: bool = True
    kl_loss_coef: float = 0.001
    eps_clip_low: float = 0.2
    eps_clip_high: float = 0.28
    loss_reduction: str = "seq_mean_token_sum_norm"
    max_seq_len: int = 2048


@dataclass
class TrainerConfig:
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    lr: float = 1e-6
    warmup_steps: int = 10
    max_grad_norm: float = 1.0
    micro_batches_per_step: int = 4
    ckpt_dir: str = "ckpts"
    ckpt_interval: int = 50

    def __post_init__(self):
        if self.algorithm.loss_reduction not in ("token_mean", "sequence_mean", "seq_mean_token_sum_norm"):
            raise ValueError(f"bad loss_reduction {self.algorithm.loss_reduction}")
        if self.algorithm.use_kl_in_reward != self.algorithm.use_kl_loss:
            raise ValueError("k3 reward and k3 loss must be enabled together")


def kl_penalty_term(logprobs, base_logprobs):
    ratio = torch.exp(torch.clamp(base_logprobs - logprobs, min=-20.0, max=20.0))
    return ratio - torch.log(ratio) - 1.0


def reduce_loss(per_token, mask, mode, max_seq_len):
    if mode == "token_mean":
        return (per_token * mask).sum() / mask.sum().clamp(min=1)
    if mode == "sequence_mean":
        return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    return (per_token * mask).sum(-1).mean() / max_seq_len


def all_reduce_metrics(metrics):
    if not (dist.is_available() and dist.is_initialized()):
        return metrics
    keys = sorted(metrics)
    t = torch.tensor([metrics[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    return dict(zip(keys, t.tolist()))


class PolicyWorker(PolicyWorkerBase):
    def __init__(self, cfg: TrainerConfig, model=None, optimizer=None):
        self.cfg = cfg
        self.model = model
        self.optimizer = optimizer
        self.step = 0
        self.scheduler = None
        if optimizer is not None:
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / cfg.warmup_steps))

    @torch.no_grad()
    def compute_returns(self, scores, logprobs, base_logprobs, loss_mask):
        algo = self.cfg.algorithm
        rewards = torch.zeros_like(logprobs)
        if algo.use_kl_in_reward:
            # ok: KL004
            rewards = -algo.kl_loss_coef * kl_penalty_term(logprobs, base_logprobs) * loss_mask
        last = loss_mask.sum(-1).long().clamp(min=1) - 1
        rewards[torch.arange(rewards.size(0)), last] += scores
        return rewards.flip(-1).cumsum(-1).flip(-1) * loss_mask

    def policy_loss(self, logprobs, old_logprobs, base_logprobs, advantages, loss_mask):
        algo = self.cfg.algorithm
        ratio = torch.exp(logprobs - old_logprobs)
        surr1 = ratio * advantages
        surr2 = ratio.clamp(1 - algo.eps_clip_low, 1 + algo.eps_clip_high) * advantages
        pg = -torch.min(surr1, surr2)
        loss = reduce_loss(pg, loss_mask, algo.loss_reduction, algo.max_seq_len)
        metrics = {"policy_loss": loss.item()}
        with torch.no_grad():
            # ok: KL002
            kl_metric = kl_penalty_term(logprobs, base_logprobs)
            metrics["policy_kl"] = ((kl_metric * loss_mask).sum() / loss_mask.sum().clamp(min=1)).item()
            metrics["clip_ratio"] = (((ratio - 1).abs() > algo.eps_clip_low).float() * loss_mask).mean().item()
        if algo.use_kl_loss:
            # ok: KL002
            kl = kl_penalty_term(logprobs, base_logprobs)
            kl_loss = reduce_loss(kl, loss_mask, algo.loss_reduction, algo.max_seq_len)
            loss = loss + algo.kl_loss_coef * kl_loss
            metrics["kl_loss"] = kl_loss.item()
        return loss, metrics

    def training_step(self, micro_batches):
        self.model.train()
        totals = {}
        with Timer("policy_train_step", totals):
            for mb in micro_batches:
                logprobs = self.model(mb["sequences"], mb["num_actions"], attention_mask=mb["attention_mask"])
                loss, metrics = self.policy_loss(
                    logprobs, mb["action_log_probs"], mb["base_action_log_probs"], mb["advantages"], mb["loss_mask"]
                )
                (loss / self.cfg.micro_batches_per_step).backward()
                for k, v in metrics.items():
                    totals[k] = totals.get(k, 0.0) + v / len(micro_batches)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        totals["grad_norm"] = float(grad_norm)
        totals["lr"] = self.scheduler.get_last_lr()[0]
        self._maybe_checkpoint()
        return all_reduce_metrics(totals)

    def _maybe_checkpoint(self):
        if self.step % self.cfg.ckpt_interval != 0:
            return
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
            if dist.get_rank() != 0:
                return
        path = os.path.join(self.cfg.ckpt_dir, f"global_step_{self.step}")
        os.makedirs(path, exist_ok=True)
        torch.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}, os.path.join(path, "policy.pt"))
