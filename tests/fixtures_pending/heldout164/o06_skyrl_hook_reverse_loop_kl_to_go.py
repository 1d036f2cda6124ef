# Reviewer: SkyRL-style policy worker, same skeleton as e06: the KL loss is the
# sampled log-ratio (k1) of a hooked clone of the log-probs. Here the hook's
# weight is the detached KL-to-go, G_t = sum_{s>=t} logr_s, accumulated by a
# backward loop over the response. The gradient reaching the log-probs is
# G_t * grad logp_t at each token: the score-function form of
# grad KL(pi||pi_ref) of the sequence.
# Verdict: correct. Neither the hook nor the k1 line is a finding.
from dataclasses import dataclass

import torch

from skyrl_train.workers.worker import PolicyWorkerBase  # noqa: F401  (not used on this path)
from skyrl_train.utils.ppo_utils import compute_approx_kl  # noqa: F401


@dataclass
class PolicyCfg:
    use_kl_loss: bool = True
    kl_loss_coef: float = 0.01
    eps_clip_low: float = 0.2
    eps_clip_high: float = 0.2
    max_generate_length: int = 8
    micro_train_batch_size: int = 2
    grad_clip: float = 1.0


class PolicyWorker:
    def __init__(self, model, optimizer, cfg=None):
        self.model = model
        self.optimizer = optimizer
        self.cfg = cfg or PolicyCfg()

    def _action_log_probs(self, sequences, attention_mask, num_actions):
        out = self.model(sequences, attention_mask=attention_mask)
        logits = out.logits[:, -num_actions - 1 : -1, :]
        return logits.log_softmax(-1).gather(-1, sequences[:, -num_actions:, None])[..., 0]

    def training_step(self, experiences):
        cfg = self.cfg
        self.optimizer.zero_grad()
        accumulation_steps = len(experiences)
        status = {}
        for exp in experiences:
            loss_mask = exp["loss_mask"]
            log_probs = self._action_log_probs(exp["sequences"], exp["attention_mask"], loss_mask.shape[1])
            ratio = (log_probs - exp["action_log_probs"]).exp()
            adv = exp["advantages"]
            surr = torch.min(ratio * adv, ratio.clamp(1 - cfg.eps_clip_low, 1 + cfg.eps_clip_high) * adv)
            policy_loss = -(surr * loss_mask).sum(-1).mean() / cfg.max_generate_length

            kl_loss = torch.zeros((), dtype=log_probs.dtype)
            if cfg.use_kl_loss:
                base_log_probs = exp["base_action_log_probs"]
                log_ratio = ((log_probs - base_log_probs) * loss_mask).detach()
                kl_weight = torch.zeros_like(log_ratio)
                running = torch.zeros_like(log_ratio[:, 0])
                for t in reversed(range(log_ratio.shape[1])):
                    running = running + log_ratio[:, t]
                    kl_weight[:, t] = running
                kl_log_probs = log_probs.clone()
                # ok: KL003
                kl_log_probs.register_hook(lambda grad, w=kl_weight: grad * w)
                # ok: KL001
                kl = (kl_log_probs - base_log_probs) * loss_mask
                kl_loss = kl.sum(-1).mean() / cfg.max_generate_length

            loss = policy_loss + cfg.kl_loss_coef * kl_loss
            (loss / accumulation_steps).backward()
            status["policy_kl"] = kl_loss.item()
        status["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip))
        self.optimizer.step()
        return status
