from dataclasses import dataclass

import torch

from .experience import compute_token_rewards, discounted_returns, whiten_advantages


@dataclass
class ReinforcePPConfig:
    kl_coef: float = 0.01
    gamma: float = 1.0
    eps_clip: float = 0.2
    micro_batch_size: int = 8
    temperature: float = 1.0


def action_log_probs(model, sequences, attention_mask, num_actions, temperature=1.0):
    logits = model(sequences, attention_mask=attention_mask).logits[:, -num_actions - 1 : -1]
    log_probs = torch.log_softmax(logits.float() / temperature, dim=-1)
    return log_probs.gather(-1, sequences[:, -num_actions:].unsqueeze(-1)).squeeze(-1)


class ReinforcePPTrainer:
    def __init__(self, actor, ref_model, optimizer, cfg: ReinforcePPConfig):
        self.actor, self.ref_model, self.optimizer, self.cfg = actor, ref_model, optimizer, cfg

    @torch.no_grad()
    def make_experience(self, sequences, attention_mask, action_mask, scores):
        n, t = action_mask.size(1), self.cfg.temperature
        action_mask = action_mask.float()
        log_probs = action_log_probs(self.actor, sequences, attention_mask, n, t)
        ref_log_probs = action_log_probs(self.ref_model, sequences, attention_mask, n, t)
        rewards, kl = compute_token_rewards(scores, log_probs, ref_log_probs, action_mask, self.cfg.kl_coef)
        returns = discounted_returns(rewards, action_mask, self.cfg.gamma)
        advantages = whiten_advantages(returns, action_mask)
        return dict(sequences=sequences, attention_mask=attention_mask, action_mask=action_mask,
                    log_probs=log_probs, advantages=advantages, kl=kl)

    def train_step(self, exp):
        bsz = exp["sequences"].size(0)
        mbs = self.cfg.micro_batch_size
        grad_accum = (bsz + mbs - 1) // mbs
        self.optimizer.zero_grad()
        for start in range(0, bsz, mbs):
            mb = {k: v[start : start + mbs] for k, v in exp.items()}
            mask = mb["action_mask"]
            log_probs = action_log_probs(
                self.actor, mb["sequences"], mb["attention_mask"], mask.size(1), self.cfg.temperature
            )
            ratio = (log_probs - mb["log_probs"]).exp()
            adv = mb["advantages"]
            surr = torch.min(ratio * adv, ratio.clamp(1 - self.cfg.eps_clip, 1 + self.cfg.eps_clip) * adv)
            loss = -(surr * mask).sum(-1).mean()
            (loss / grad_accum).backward()
        self.optimizer.step()
        return {"kl": exp["kl"].sum(-1).mean().item()}
