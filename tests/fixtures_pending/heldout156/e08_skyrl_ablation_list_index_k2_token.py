# Reviewer: SkyRL-style policy loss for an ablation sweep. KL_ABLATIONS is an ordered
# list of (name, fn) pairs; every step all of them are evaluated on DETACHED log-probs
# for the metrics table, and the pair at cfg.kl_ablation_index (default 1, "k2") is
# called again on the live log-probs for the loss. Per-token k2 summed over the
# response has gradient sum_t logr_t grad logp_t: only the s = t term of the
# reward-to-go, a token-level (partial) gradient of the sequence KL(pi||pi_ref).
# Verdict: bug, KL003, reported on the line of the loss that calls the selected helper.
from dataclasses import dataclass

import torch

from skyrl_train.utils.ppo_utils import PolicyLossRegistry, reduce_loss
from skyrl_train.workers.worker import PolicyWorkerBase


def _k1_to_go(logprobs, base_logprobs, mask):
    log_ratio = (logprobs - base_logprobs).detach() * mask
    kl_to_go = log_ratio.flip(-1).cumsum(-1).flip(-1)
    return log_ratio + kl_to_go * (logprobs - logprobs.detach())


KL_ABLATIONS = [
    # ok: KL001
    ("k1", lambda lp, base, m: lp - base),
    ("k2", lambda lp, base, m: 0.5 * (lp - base) ** 2),
    # ok: KL002
    ("k3", lambda lp, base, m: torch.exp(base - lp) - (base - lp) - 1),
    ("k1_to_go", _k1_to_go),
]


@dataclass
class AlgorithmConfig:
    eps_clip_low: float = 0.2
    eps_clip_high: float = 0.2
    use_kl_loss: bool = True
    kl_loss_coef: float = 0.001
    kl_ablation_index: int = 1
    max_seq_len: int = 1024


def ppo_policy_loss_with_kl(log_probs, old_log_probs, base_log_probs, advantages, loss_mask, cfg: AlgorithmConfig):
    ratio = torch.exp(log_probs - old_log_probs)
    surr1 = ratio * advantages
    surr2 = ratio.clamp(1 - cfg.eps_clip_low, 1 + cfg.eps_clip_high) * advantages
    pg_loss = (-torch.min(surr1, surr2) * loss_mask).sum(-1).mean() / cfg.max_seq_len

    metrics = {}
    with torch.no_grad():
        for name, fn in KL_ABLATIONS:
            value = fn(log_probs.detach(), base_log_probs, loss_mask)
            metrics[f"kl_table/{name}"] = (value * loss_mask).sum(-1).mean().item()

    loss = pg_loss
    if cfg.use_kl_loss:
        kl_name, kl_fn = KL_ABLATIONS[cfg.kl_ablation_index]
        # error: KL003
        kl_tok = kl_fn(log_probs, base_log_probs, loss_mask)
        kl_loss = (kl_tok * loss_mask).sum(-1).mean() / cfg.max_seq_len
        loss = loss + cfg.kl_loss_coef * kl_loss
        metrics["kl_loss"] = kl_loss.item()
        metrics["kl_loss_estimator"] = kl_name
    metrics["policy_loss"] = pg_loss.item()
    return loss, metrics


class AblationPolicyWorker(PolicyWorkerBase):
    def training_step(self, experience):
        log_probs = self.model(experience.sequences, experience.num_actions, attention_mask=experience.attention_mask)
        loss, metrics = ppo_policy_loss_with_kl(
            log_probs, experience.action_log_probs, experience.base_action_log_probs,
            experience.advantages, experience.loss_mask, self.cfg.trainer.algorithm,
        )
        self.strategy.backward(loss, self.model, self.optimizer)
        return metrics
