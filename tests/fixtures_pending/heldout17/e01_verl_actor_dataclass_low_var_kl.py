"""verl-style data-parallel PPO actor with a KL loss against the reference policy.

The KL loss type is read from ``ActorConfig.kl_loss_type`` (default
``"low_var_kl"``, GRPO's k3) and aggregated with the same ``agg_loss`` as the
policy-gradient term.
"""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import torch


@dataclass
class PolicyLossConfig:
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28
    clip_ratio_c: float = 3.0
    loss_agg_mode: str = "token-mean"


@dataclass
class ActorConfig:
    ppo_mini_batch_size: int = 16
    ppo_micro_batch_size_per_gpu: int = 4
    ppo_epochs: int = 1
    grad_clip: float = 1.0
    use_kl_loss: bool = True
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    entropy_coeff: float = 0.0
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: Optional[int] = None) -> torch.Tensor:
    return (values * mask).sum(axis=axis) if axis is not None else (values * mask).sum()


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: Optional[int] = None) -> torch.Tensor:
    s = masked_sum(values, mask, axis)
    return s / (mask.sum(axis=axis) if axis is not None else mask.sum()).clamp(min=1.0)


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str) -> torch.Tensor:
    if loss_agg_mode == "token-mean":
        return masked_mean(loss_mat, loss_mask)
    if loss_agg_mode == "seq-mean-token-sum":
        return masked_sum(loss_mat, loss_mask, axis=-1).mean()
    if loss_agg_mode == "seq-mean-token-mean":
        return masked_mean(loss_mat, loss_mask, axis=-1).mean()
    raise ValueError(f"Invalid loss_agg_mode: {loss_agg_mode}")


def kl_penalty(logprob: torch.FloatTensor, ref_logprob: torch.FloatTensor, kl_penalty: str) -> torch.FloatTensor:
    """Per-token KL estimate between the actor and the reference policy."""
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty == "abs":
        return (logprob - ref_logprob).abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        kl = ref_logprob - logprob
        kl = torch.clamp(kl, min=-20, max=20)
        ratio = torch.exp(kl)
        kld = (ratio - kl - 1).contiguous()
        return torch.clamp(kld, min=-10, max=10)
    raise NotImplementedError(kl_penalty)


def compute_policy_loss(old_log_prob, log_prob, advantages, response_mask, cfg: PolicyLossConfig):
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - cfg.clip_ratio_low, 1 + cfg.clip_ratio_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_losses3 = -advantages * cfg.clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    return agg_loss(pg_losses, response_mask, cfg.loss_agg_mode)


class DataParallelPPOActor:
    def __init__(self, config: ActorConfig, actor_module: Any = None, actor_optimizer: Any = None):
        self.config = config
        self.actor_module = actor_module
        self.actor_optimizer = actor_optimizer

    def _forward_micro_batch(self, micro_batch: Dict[str, torch.Tensor], temperature: float) -> torch.Tensor:
        responses = micro_batch["responses"]
        response_length = responses.size(-1)
        output = self.actor_module(input_ids=micro_batch["input_ids"], attention_mask=micro_batch["attention_mask"])
        logits = output.logits[:, -response_length - 1 : -1, :] / temperature
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        return torch.gather(log_probs, -1, responses.unsqueeze(-1)).squeeze(-1)

    def policy_loss(self, log_prob: torch.Tensor, micro_batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        response_mask = micro_batch["response_mask"]
        old_log_prob = micro_batch["old_log_probs"]
        advantages = micro_batch["advantages"]

        pg_loss = compute_policy_loss(old_log_prob, log_prob, advantages, response_mask, self.config.policy_loss)
        policy_loss = pg_loss
        if self.config.use_kl_loss:
            ref_log_prob = micro_batch["ref_log_prob"]
            # error: KL002
            kld = kl_penalty(logprob=log_prob, ref_logprob=ref_log_prob, kl_penalty=self.config.kl_loss_type)
            kl_loss = agg_loss(loss_mat=kld, loss_mask=response_mask, loss_agg_mode=self.config.policy_loss.loss_agg_mode)
            policy_loss = policy_loss + kl_loss * self.config.kl_loss_coef
        return policy_loss

    def update_policy(self, data: Dict[str, torch.Tensor], temperature: float = 1.0) -> Dict[str, List[float]]:
        metrics: Dict[str, List[float]] = {"actor/pg_loss": []}
        bsz = data["responses"].size(0)
        mbs = self.config.ppo_micro_batch_size_per_gpu
        grad_accum = self.config.ppo_mini_batch_size // mbs
        for _ in range(self.config.ppo_epochs):
            for start in range(0, bsz, self.config.ppo_mini_batch_size):
                self.actor_optimizer.zero_grad()
                for mb_start in range(start, min(start + self.config.ppo_mini_batch_size, bsz), mbs):
                    micro_batch = {k: v[mb_start : mb_start + mbs] for k, v in data.items()}
                    log_prob = self._forward_micro_batch(micro_batch, temperature=temperature)
                    loss = self.policy_loss(log_prob, micro_batch) / grad_accum
                    loss.backward()
                    metrics["actor/pg_loss"].append(loss.item())
                torch.nn.utils.clip_grad_norm_(self.actor_module.parameters(), self.config.grad_clip)
                self.actor_optimizer.step()
        return metrics
