"""SkyRL-style policy worker: PPO micro-batch loop with a KL loss to the reference.

The rollout stage stores the behaviour policy's log-probs (computed without
gradient) and the reference log-probs in the batch; the training stage
recomputes the policy's log-probs with gradient for each micro-batch.
"""

from dataclasses import dataclass
from typing import Dict, List, Optional

import torch


@dataclass
class PolicyTrainerConfig:
    micro_train_batch_size_per_gpu: int = 2
    eps_clip_low: float = 0.2
    eps_clip_high: float = 0.2
    use_kl_loss: bool = True
    kl_loss_coef: float = 0.001
    kl_estimator_type: str = "k2"
    max_norm: float = 1.0


def masked_mean(tensor: torch.Tensor, mask: Optional[torch.Tensor], dim: Optional[int] = None) -> torch.Tensor:
    if mask is None:
        return tensor.mean(dim) if dim is not None else tensor.mean()
    if dim is None:
        return (tensor * mask).sum() / mask.sum().clamp(min=1.0)
    return (tensor * mask).sum(dim) / mask.sum(dim).clamp(min=1.0)


def compute_approx_kl(
    log_probs: torch.Tensor,
    log_probs_base: torch.Tensor,
    loss_mask: Optional[torch.Tensor] = None,
    kl_estimator_type: str = "k3",
) -> torch.Tensor:
    if kl_estimator_type == "k1":
        log_ratio = log_probs - log_probs_base
    elif kl_estimator_type == "abs":
        log_ratio = (log_probs - log_probs_base).abs()
    elif kl_estimator_type == "k2":
        log_ratio = log_probs - log_probs_base
        log_ratio = log_ratio**2 / 2.0
    elif kl_estimator_type == "k3":
        log_ratio = -(log_probs - log_probs_base)
        log_ratio = log_ratio.exp() - 1 - log_ratio
    else:
        raise ValueError(f"Invalid KL estimator type: {kl_estimator_type}")
    if loss_mask is not None:
        log_ratio = log_ratio * loss_mask
    return log_ratio


def ppo_policy_loss(log_probs, old_log_probs, advantages, loss_mask, eps_low: float, eps_high: float) -> torch.Tensor:
    ratio = (log_probs - old_log_probs).exp()
    surr1 = ratio * advantages
    surr2 = ratio.clamp(1 - eps_low, 1 + eps_high) * advantages
    return masked_mean(-torch.min(surr1, surr2), loss_mask)


class PolicyWorker:
    def __init__(self, model, ref_model, optimizer, cfg: PolicyTrainerConfig = PolicyTrainerConfig()):
        self.model = model
        self.ref_model = ref_model
        self.optimizer = optimizer
        self.cfg = cfg

    def _action_log_probs(self, model, sequences: torch.Tensor, num_actions: int, attention_mask: torch.Tensor) -> torch.Tensor:
        logits = model(sequences, attention_mask=attention_mask).logits[:, -num_actions - 1 : -1]
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        return log_probs.gather(-1, sequences[:, -num_actions:].unsqueeze(-1)).squeeze(-1)

    @torch.no_grad()
    def compute_rollout_log_probs(self, batch: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        num_actions = batch["loss_mask"].size(1)
        batch["action_log_probs"] = self._action_log_probs(self.model, batch["sequences"], num_actions, batch["attention_mask"])
        batch["base_action_log_probs"] = self._action_log_probs(self.ref_model, batch["sequences"], num_actions, batch["attention_mask"])
        return batch

    def training_step(self, experience: Dict[str, torch.Tensor], accumulation_steps: int) -> Dict[str, float]:
        loss_mask = experience["loss_mask"]
        old_action_log_probs = experience["action_log_probs"]
        base_action_log_probs = experience["base_action_log_probs"]
        num_actions = loss_mask.size(1)
        action_log_probs = self._action_log_probs(self.model, experience["sequences"], num_actions, experience["attention_mask"])
        policy_loss = ppo_policy_loss(
            action_log_probs, old_action_log_probs, experience["advantages"], loss_mask, self.cfg.eps_clip_low, self.cfg.eps_clip_high
        )
        if self.cfg.use_kl_loss:
            # error: KL005
            kl = compute_approx_kl(old_action_log_probs, base_action_log_probs, loss_mask=loss_mask, kl_estimator_type=self.cfg.kl_estimator_type)
            kl_loss = masked_mean(kl, loss_mask, dim=-1).mean()
        else:
            kl_loss = torch.tensor(0.0)
        loss = policy_loss + kl_loss * self.cfg.kl_loss_coef
        (loss / accumulation_steps).backward()
        return {"policy_loss": policy_loss.item(), "policy_kl": kl_loss.item()}

    def ppo_train(self, batch: Dict[str, torch.Tensor]) -> List[Dict[str, float]]:
        batch = self.compute_rollout_log_probs(batch)
        n = batch["sequences"].size(0)
        mbs = self.cfg.micro_train_batch_size_per_gpu
        accumulation_steps = max(1, n // mbs)
        status = []
        self.optimizer.zero_grad()
        for start in range(0, n, mbs):
            experience = {k: v[start : start + mbs] for k, v in batch.items()}
            status.append(self.training_step(experience, accumulation_steps))
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_norm)
        self.optimizer.step()
        return status
