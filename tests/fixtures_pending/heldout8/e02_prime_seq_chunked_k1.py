"""PRIME-style policy update with an implicit process reward model (bug: KL001).

The implicit PRM scores each token with beta_rm * (log pi_rm - log pi_rm_ref),
detached, and the policy is updated with RLOO advantages. The actor also adds a
KL loss to its initial (SFT) weights, accumulated chunk by chunk over the
sequence to bound memory. That KL loss is the k1 estimate logp - init_logp:
autograd gives grad logp, whose expectation under y ~ pi is 0, so the "KL
regulariser" has zero expected gradient and does not regularise at all.
"""

from dataclasses import dataclass

import torch


@dataclass
class PrimeActorConfig:
    kl_coef: float = 0.01
    seq_chunk: int = 512
    clip_eps: float = 0.2
    prm_beta: float = 0.05


@torch.no_grad()
def implicit_process_rewards(rm_logps, rm_ref_logps, response_mask, prm_beta):
    """Token-level rewards of an implicit PRM: beta * log(pi_rm / pi_rm_ref)."""
    return prm_beta * (rm_logps - rm_ref_logps) * response_mask


@torch.no_grad()
def rloo_token_advantages(process_rewards, outcome_scores, response_mask, n_samples):
    returns = process_rewards.flip(-1).cumsum(-1).flip(-1)
    returns = returns + outcome_scores.unsqueeze(-1) * response_mask
    grouped = returns.view(-1, n_samples, returns.shape[-1])
    loo = (grouped.sum(1, keepdim=True) - grouped) / (n_samples - 1)
    return (grouped - loo).view_as(returns) * response_mask


class PrimeActor:
    def __init__(self, config: PrimeActorConfig, actor_module, optimizer):
        self.config = config
        self.actor_module = actor_module
        self.optimizer = optimizer

    def compute_loss(self, logps, old_logps, init_logps, advantages, response_mask):
        cfg = self.config
        total_tokens = response_mask.sum().clamp(min=1)
        pg_loss = logps.new_zeros(())
        kl_loss = logps.new_zeros(())
        seq_len = logps.shape[-1]
        for start in range(0, seq_len, cfg.seq_chunk):
            end = min(start + cfg.seq_chunk, seq_len)
            lp = logps[:, start:end]
            m = response_mask[:, start:end]
            ratio = torch.exp(lp - old_logps[:, start:end])
            adv = advantages[:, start:end]
            surr = torch.max(-adv * ratio, -adv * ratio.clamp(1 - cfg.clip_eps, 1 + cfg.clip_eps))
            pg_loss = pg_loss + (surr * m).sum()
            # error: KL001
            kl_chunk = lp - init_logps[:, start:end]
            kl_loss = kl_loss + (kl_chunk * m).sum()
        pg_loss = pg_loss / total_tokens
        kl_loss = kl_loss / total_tokens
        return pg_loss + cfg.kl_coef * kl_loss, {"actor/kl": kl_loss.item()}

    def update(self, batch):
        logps = self.actor_module.token_logps(batch["input_ids"], batch["responses"])
        loss, metrics = self.compute_loss(
            logps, batch["old_logps"], batch["init_logps"], batch["advantages"], batch["response_mask"]
        )
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return metrics
