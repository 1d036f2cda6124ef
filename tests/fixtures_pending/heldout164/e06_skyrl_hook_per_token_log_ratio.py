# Reviewer: SkyRL-style policy worker. The KL loss is written as the sampled
# log-ratio (k1, printed as "policy_kl") of a clone of the log-probs; a tensor
# hook on that clone multiplies the gradient flowing back into the log-probs
# by the detached per-token log-ratio. The k1 gradient (1 per token) becomes
# sg(logr_t) * grad logp_t: the per-token score function, summed over the
# response with no reward-to-go. That is the token-level partial gradient of
# KL(pi||pi_ref), not the gradient of the sequence KL.
# Verdict: bug, KL003, reported on the register_hook line (the line that
# multiplies the detached weight into the log-probs' gradient).
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
                kl_weight = ((log_probs - base_log_probs) * loss_mask).detach()
                kl_log_probs = log_probs.clone()
                # error: KL003
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
