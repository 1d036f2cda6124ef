# Review: PRIME-style actor update where the KL appears twice with the same
# coefficient: k3 subtracted from the per-token process rewards (credited by
# returns) and k3 added to the loss with its gradient. Each half alone is off;
# together the k3-loss gradient cancels the reward's bias and the sum is the sequence KL(pi||pi_ref).
from dataclasses import dataclass, field

import torch


@dataclass
class PrimeConfig:
    prm_beta: float = 0.05
    kl_coef: float = 0.02
    rloo_k: int = 4
    max_response_length: int = 1024
    reward_weights: dict = field(default_factory=lambda: {"outcome": 1.0, "process": 1.0})


def rloo(scores: torch.Tensor, k: int) -> torch.Tensor:
    g = scores.view(-1, k)
    return (g - (g.sum(1, keepdim=True) - g) / (k - 1)).flatten()


def k3(logps, ref_logps):
    log_ratio = ref_logps - logps
    return torch.exp(log_ratio) - log_ratio - 1


class PrimeActor:
    def __init__(self, actor, prm, ref, cfg: PrimeConfig):
        self.actor, self.prm, self.ref, self.cfg = actor, prm, ref, cfg

    @torch.no_grad()
    def process_rewards(self, prm_logps, ref_logps, actor_logps, mask):
        # implicit PRM: r_t = beta * log(pi_prm / pi_ref); the PRM is not the actor
        # ok: KL006
        implicit = self.cfg.prm_beta * (prm_logps - ref_logps)
        # ok: KL004
        kl_penalty = self.cfg.kl_coef * k3(actor_logps, ref_logps)
        return (implicit - kl_penalty) * mask

    @torch.no_grad()
    def advantages(self, outcome_scores, prm_logps, ref_logps, actor_logps, mask):
        w = self.cfg.reward_weights
        proc = self.process_rewards(prm_logps, ref_logps, actor_logps, mask)
        proc_returns = proc.flip(-1).cumsum(-1).flip(-1)
        outcome_adv = rloo(outcome_scores, self.cfg.rloo_k)
        return (w["outcome"] * outcome_adv.unsqueeze(-1) + w["process"] * proc_returns) * mask

    def policy_loss(self, logps, ref_logps, advantages, mask):
        ratio = torch.exp(logps - logps.detach())
        pg = -ratio * advantages
        # ok: KL002
        per_token_kl = k3(logps, ref_logps)
        per_token = pg + self.cfg.kl_coef * per_token_kl
        return ((per_token * mask).sum(-1) / self.cfg.max_response_length).mean()

    def update(self, batch, optimizer):
        mask = batch["response_mask"]
        logps = self.actor.log_probs(batch["input_ids"], mask)
        with torch.no_grad():
            prm_logps = self.prm.log_probs(batch["input_ids"], mask)
            ref_logps = self.ref.log_probs(batch["input_ids"], mask)
        adv = self.advantages(batch["acc"], prm_logps, ref_logps, logps.detach(), mask)
        loss = self.policy_loss(logps, ref_logps, adv, mask)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.item()
