# Reviewer: SkyRL-style worker loss on the policy's own rollouts. The KL to the
# reference is written from library pieces: the cross-entropy of pi against the
# reference, -(pi.probs * ref.logits).sum(-1), minus pi.entropy(). That is the
# exact full-vocabulary KL(pi||pi_ref) at each position (Categorical.logits are
# normalised log-probs). It is masked and summed over the response tokens with
# its gradient: the token-level partial gradient of the sequence KL(pi||pi_ref),
# missing the credit every token gets for the KL of the positions after it.
# Verdict: bug, KL003, reported on the `token_kl = cross_entropy - pi.entropy()` line.
from dataclasses import dataclass

import torch
from torch.distributions import Categorical

from skyrl_train.distributed.strategy import DistributedStrategy
from skyrl_train.training_batch import TrainingInputBatch


@dataclass
class PolicyLossConfig:
    eps_clip_low: float = 0.2
    eps_clip_high: float = 0.2
    use_kl_loss: bool = True
    kl_loss_coef: float = 0.02


def ppo_policy_loss(log_probs, old_log_probs, advantages, loss_mask, cfg: PolicyLossConfig):
    ratio = (log_probs - old_log_probs).exp()
    surr = torch.min(ratio * advantages, ratio.clamp(1 - cfg.eps_clip_low, 1 + cfg.eps_clip_high) * advantages)
    return -(surr * loss_mask).sum(-1).mean()


def compute_loss(logits, base_logits, response_ids, loss_mask, old_log_probs, advantages, cfg: PolicyLossConfig):
    pi = Categorical(logits=logits)
    ref = Categorical(logits=base_logits.detach())
    log_probs = pi.log_prob(response_ids)

    loss = ppo_policy_loss(log_probs, old_log_probs, advantages.unsqueeze(-1), loss_mask, cfg)
    stats = {"policy_loss": loss.item()}
    if cfg.use_kl_loss:
        cross_entropy = -(pi.probs * ref.logits).sum(-1)
        # error: KL003
        token_kl = cross_entropy - pi.entropy()
        kl_loss = (token_kl * loss_mask).sum(-1).mean()
        loss = loss + cfg.kl_loss_coef * kl_loss
        stats["kl_loss"] = kl_loss.item()
    return loss, stats


class PolicyWorker:
    def __init__(self, model, ref_model, strategy: DistributedStrategy, cfg: PolicyLossConfig):
        self.model = model
        self.ref_model = ref_model
        self.strategy = strategy
        self.cfg = cfg

    def training_step(self, batch: TrainingInputBatch):
        n = batch["response_mask"].shape[1]
        logits = self.model(batch["sequences"], attention_mask=batch["attention_mask"]).logits[:, -n - 1 : -1]
        with torch.no_grad():
            base_logits = self.ref_model(batch["sequences"], attention_mask=batch["attention_mask"]).logits
            base_logits = base_logits[:, -n - 1 : -1]
        response_ids = batch["sequences"][:, -n:]
        loss, stats = compute_loss(
            logits, base_logits, response_ids, batch["response_mask"], batch["action_log_probs"], batch["advantages"], self.cfg
        )
        self.strategy.backward(loss, self.model, self.model.optimizer)
        self.strategy.optimizer_step(self.model.optimizer, self.model)
        return stats
