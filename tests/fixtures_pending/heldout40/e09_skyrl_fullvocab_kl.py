# Reviewer: SkyRL-style policy worker with an "exact" KL loss. full_vocab_kl returns, at each
# response position, sum_v p_v (log p_v - log q_v) over the whole vocabulary (no sampled
# estimator); _forward_backward_micro sums it over the positions of the policy's own sampled
# responses, adds it to the PG loss and calls strategy.backward. The exact per-position KL
# summed over sampled prefixes keeps only the s = t term of the sequence KL gradient (it
# ignores how a token steers which later prefixes are reached): the token-level partial
# gradient of KL(pi||pi_ref). BUG (KL003), reported at the full_vocab_kl call.
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class PolicyWorkerConfig:
    kl_loss_coef: float = 0.01
    use_kl_loss: bool = True
    eps_clip_low: float = 0.2
    eps_clip_high: float = 0.28
    temperature: float = 1.0
    max_generate_length: int = 1024


def full_vocab_kl(logits: torch.Tensor, ref_logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """KL(pi(.|prefix) || pi_ref(.|prefix)) at every position, exactly, from the logits."""
    logp = F.log_softmax(logits.float() / temperature, dim=-1)
    ref_logp = F.log_softmax(ref_logits.float() / temperature, dim=-1)
    return (logp.exp() * (logp - ref_logp)).sum(dim=-1)


class PolicyWorker:
    def __init__(self, cfg: PolicyWorkerConfig, model, ref_model, optimizer, strategy):
        self.cfg = cfg
        self.model = model
        self.ref_model = ref_model
        self.optimizer = optimizer
        self.strategy = strategy

    def _response_logits(self, model, experience):
        out = model(experience.sequences, attention_mask=experience.attention_mask)
        n = experience.loss_mask.size(1)
        return out.logits[:, -n - 1 : -1]

    def _forward_backward_micro(self, experience):
        mask = experience.loss_mask
        logits = self._response_logits(self.model, experience)
        logp_all = F.log_softmax(logits.float() / self.cfg.temperature, dim=-1)
        action_log_probs = logp_all.gather(-1, experience.response_ids.unsqueeze(-1)).squeeze(-1)

        ratio = torch.exp(action_log_probs - experience.action_log_probs)
        adv = experience.advantages
        surr1 = ratio * adv
        surr2 = ratio.clamp(1 - self.cfg.eps_clip_low, 1 + self.cfg.eps_clip_high) * adv
        policy_loss = (-torch.min(surr1, surr2) * mask).sum() / (mask.size(0) * self.cfg.max_generate_length)

        kl_loss = torch.zeros((), device=logits.device)
        if self.cfg.use_kl_loss:
            with torch.no_grad():
                ref_logits = self._response_logits(self.ref_model, experience)
            # error: KL003
            kl_per_pos = full_vocab_kl(logits, ref_logits, self.cfg.temperature)
            kl_loss = (kl_per_pos * mask).sum(-1).mean()

        loss = policy_loss + self.cfg.kl_loss_coef * kl_loss
        self.strategy.backward(loss, self.model, self.optimizer)
        return {"policy_loss": policy_loss.item(), "policy_kl": kl_loss.item()}

    def ppo_train(self, experiences):
        status = []
        for exp in experiences:
            status.append(self._forward_backward_micro(exp))
            self.strategy.optimizer_step(self.optimizer, self.model, name="actor")
        return status
