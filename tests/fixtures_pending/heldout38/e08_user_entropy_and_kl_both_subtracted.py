# Reviewer: the entropy bonus is correctly subtracted from the loss (we want *more*
# entropy), but the KL penalty was written the same way, `- kl_coef * kl_term`. The KL
# term itself is the right one (score function weighted by the KL-to-go), so its sign is
# the only bug: every step pushes the policy away from the SFT reference.
from dataclasses import dataclass

import torch


@dataclass
class TrainConfig:
    lr: float = 1e-6
    ent_coef: float = 0.001
    kl_coef: float = 0.05
    grad_accum_steps: int = 4
    max_grad_norm: float = 1.0


def token_logps_and_entropy(model, input_ids, attention_mask, response_mask):
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
    log_probs = logits.log_softmax(dim=-1)
    logps = log_probs.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return logps, entropy


def reinforce_losses(logps, ref_logps, entropy, mask, advantages, cfg: TrainConfig):
    n_seqs = mask.shape[0]
    pg_loss = -(advantages.unsqueeze(1) * logps * mask).sum() / n_seqs
    entropy_bonus = (entropy * mask).sum() / n_seqs

    log_ratio = (logps - ref_logps).detach() * mask
    # error: KL006
    kl_term = (log_ratio.flip(-1).cumsum(-1).flip(-1) * logps * mask).sum() / n_seqs

    loss = pg_loss - cfg.ent_coef * entropy_bonus - cfg.kl_coef * kl_term
    stats = {
        "pg_loss": pg_loss.item(),
        "entropy": entropy_bonus.item(),
        "kl": (log_ratio.sum() / n_seqs).item(),
    }
    return loss, stats


class Trainer:
    def __init__(self, policy, ref_policy, cfg: TrainConfig):
        self.policy, self.ref_policy, self.cfg = policy, ref_policy, cfg
        self.opt = torch.optim.AdamW(policy.parameters(), lr=cfg.lr)

    def train_on_rollouts(self, minibatches):
        self.opt.zero_grad()
        for i, mb in enumerate(minibatches):
            mask = mb["response_mask"][:, 1:]
            logps, entropy = token_logps_and_entropy(self.policy, mb["input_ids"], mb["attention_mask"], mask)
            with torch.no_grad():
                ref_logps, _ = token_logps_and_entropy(self.ref_policy, mb["input_ids"], mb["attention_mask"], mask)
            loss, stats = reinforce_losses(logps, ref_logps, entropy, mask, mb["advantages"], self.cfg)
            (loss / self.cfg.grad_accum_steps).backward()
            if (i + 1) % self.cfg.grad_accum_steps == 0:
                torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.cfg.max_grad_norm)
                self.opt.step()
                self.opt.zero_grad()
        return stats
