# Part of o08 (see __init__.py).
# Verdict: correct: the rollout-log-prob KL is a reward credited by reward-to-go.
import torch

from skyrl_train.training_batch import TrainingInputBatch

from . import estimators as est
from .config import AlgorithmConfig


class PolicyLoss:
    def __init__(self, cfg: AlgorithmConfig):
        self.cfg = cfg.validate()

    def __call__(self, log_probs, batch):
        cfg = self.cfg
        loss_mask = batch["loss_mask"]
        advantages = batch["advantages"]
        if cfg.use_kl_in_reward:
            with torch.no_grad():
                # ok: KL005
                kl = est.compute_approx_kl(batch["action_log_probs"], batch["base_action_log_probs"], loss_mask=loss_mask, kl_estimator_type=cfg.kl_estimator_type)
                kl_to_go = kl.flip(-1).cumsum(-1).flip(-1)
                advantages = (advantages - cfg.kl_reward_coef * kl_to_go) * loss_mask
        ratio = (log_probs - batch["action_log_probs"]).exp()
        surr1 = ratio * advantages
        surr2 = ratio.clamp(1 - cfg.eps_clip_low, 1 + cfg.eps_clip_high) * advantages
        loss = est.reduce_loss(-torch.min(surr1, surr2), loss_mask, cfg.loss_reduction)
        kl_loss = torch.tensor(0.0)
        if cfg.use_kl_loss:
            # ok: KL005
            kl = est.compute_approx_kl(batch["action_log_probs"], batch["base_action_log_probs"], loss_mask=loss_mask, kl_estimator_type=cfg.kl_estimator_type)
            kl_loss = est.reduce_loss(kl, loss_mask, cfg.loss_reduction)
            loss = loss + cfg.kl_loss_coef * kl_loss
        return loss, {"policy_kl_loss": kl_loss.item()}


def training_step(model, optimizer, batch: TrainingInputBatch, policy_loss: PolicyLoss):
    logits = model(batch["sequences"], attention_mask=batch["attention_mask"]).logits
    n = batch["loss_mask"].size(1)
    logits = logits[:, -n - 1 : -1]
    log_probs = torch.gather(logits.log_softmax(-1), -1, batch["sequences"][:, -n:].unsqueeze(-1)).squeeze(-1)
    loss, info = policy_loss(log_probs, batch)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return info
