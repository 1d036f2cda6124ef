# Reviewer: SkyRL-style policy loss. The KL estimator is an Enum held in the
# trainer config (default KLEstimatorType.K1) and dispatched by a `match` on the
# enum inside the loss. The default case uses k1 = log_probs - base_log_probs
# with its gradient as the KL loss, summed over tokens: its expected gradient is
# zero (E[grad logp] = 0), so use_kl_loss=True adds only noise.
# Verdict: bug, KL001, on the k1 line of the K1 case (the K3 case does not run
# under the default configuration).
from dataclasses import dataclass, field
from enum import Enum

import torch

from skyrl_train.utils import masked_mean


class KLEstimatorType(str, Enum):
    K1 = "k1"
    K2 = "k2"
    K3 = "k3"


@dataclass
class AlgorithmConfig:
    use_kl_loss: bool = True
    kl_loss_coef: float = 0.001
    kl_estimator_type: KLEstimatorType = KLEstimatorType.K1
    eps_clip_low: float = 0.2
    eps_clip_high: float = 0.2
    loss_reduction: str = "seq_mean_token_sum"


@dataclass
class TrainerConfig:
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    micro_train_batch_size_per_gpu: int = 2


class PolicyWorker:
    def __init__(self, cfg: TrainerConfig, model=None, optimizer=None):
        self.cfg = cfg
        self.model = model
        self.optimizer = optimizer

    def policy_loss(self, log_probs, old_log_probs, base_log_probs, advantages, loss_mask):
        algo = self.cfg.algorithm
        ratio = (log_probs - old_log_probs).exp()
        surr1 = ratio * advantages
        surr2 = ratio.clamp(1 - algo.eps_clip_low, 1 + algo.eps_clip_high) * advantages
        pg = -torch.min(surr1, surr2)
        loss = (pg * loss_mask).sum(-1).mean()
        kl_value = torch.zeros(())
        if algo.use_kl_loss:
            match algo.kl_estimator_type:
                case KLEstimatorType.K1:
                    # error: KL001
                    kl = log_probs - base_log_probs
                case KLEstimatorType.K2:
                    kl = 0.5 * (log_probs - base_log_probs).square()
                case KLEstimatorType.K3:
                    log_ratio = base_log_probs - log_probs
                    # ok: KL002
                    kl = log_ratio.exp() - log_ratio - 1
            kl_value = (kl * loss_mask).sum(-1).mean()
            loss = loss + algo.kl_loss_coef * kl_value
        return loss, {"policy_kl": kl_value.item(), "ppo_clip_ratio": (surr2 < surr1).float().mean().item()}

    def training_step(self, experience):
        self.model.train()
        for mb in experience.split(self.cfg.micro_train_batch_size_per_gpu):
            out = self.model(mb.sequences, attention_mask=mb.attention_mask)
            logits = out.logits[:, -mb.num_actions - 1 : -1]
            log_probs = torch.gather(logits.log_softmax(-1), -1, mb.actions.unsqueeze(-1)).squeeze(-1)
            loss, status = self.policy_loss(log_probs, mb.action_log_probs, mb.base_action_log_probs, mb.advantages, mb.loss_mask)
            loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        return {**status, "response_length": masked_mean(mb.loss_mask.float(), mb.attention_mask).item()}
