# Reviewer: verl-style actor whose KL loss uses the fused F.poisson_nll_loss
# kernel: with log_input=True and target 1 it returns exp(input) - input, so
# poisson_nll_loss(ref_log_prob - log_prob, 1) - 1 is exactly
# exp(ref - logp) - (ref - logp) - 1, the k3 / low_var_kl estimate. It is
# differentiated through log_prob and summed over the response tokens: its
# expected gradient is the token-level gradient of KL(pi_ref||pi), not
# grad KL(pi||pi_ref).
# Verdict: bug, KL002, reported on the poisson_nll_loss line (the estimate).
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from verl import DataProto
from verl.utils.torch_functional import logprobs_from_logits


@dataclass
class ActorConfig:
    clip_ratio: float = 0.2
    use_kl_loss: bool = True
    kl_loss_coef: float = 0.001
    ppo_micro_batch_size: int = 8


class DataParallelPPOActor:
    def __init__(self, config: ActorConfig, actor_module=None, actor_optimizer=None):
        self.config = config
        self.actor_module = actor_module
        self.actor_optimizer = actor_optimizer

    def _forward_micro_batch(self, micro_batch):
        out = self.actor_module(input_ids=micro_batch["input_ids"], attention_mask=micro_batch["attention_mask"])
        logits = out.logits[:, -micro_batch["responses"].shape[-1] - 1 : -1]
        return logprobs_from_logits(logits, micro_batch["responses"])

    def compute_loss(self, log_prob, old_log_prob, ref_log_prob, advantages, response_mask):
        cfg = self.config
        negative_approx_kl = log_prob - old_log_prob
        ratio = torch.exp(negative_approx_kl)
        pg_losses = -advantages * ratio
        pg_losses2 = -advantages * torch.clamp(ratio, 1 - cfg.clip_ratio, 1 + cfg.clip_ratio)
        pg_loss = (torch.maximum(pg_losses, pg_losses2) * response_mask).sum(-1).mean()
        metrics = {"actor/pg_loss": pg_loss.detach().item()}
        policy_loss = pg_loss
        if cfg.use_kl_loss:
            # low-variance KL through the fused Poisson kernel: exp(x) - 1 * x, minus its minimum 1
            # error: KL002
            kld = F.poisson_nll_loss(ref_log_prob - log_prob, torch.ones_like(log_prob), log_input=True, full=False, reduction="none") - 1.0
            kl_loss = (kld * response_mask).sum(-1).mean()
            policy_loss = policy_loss + cfg.kl_loss_coef * kl_loss
            metrics["actor/kl_loss"] = kl_loss.detach().item()
        return policy_loss, metrics

    def update_policy(self, data: DataProto):
        self.actor_module.train()
        metrics = {}
        for mb in data.split(self.config.ppo_micro_batch_size):
            log_prob = self._forward_micro_batch(mb)
            loss, m = self.compute_loss(log_prob, mb["old_log_probs"], mb["ref_log_prob"], mb["advantages"], mb["response_mask"])
            loss.backward()
            metrics.update(m)
        self.actor_optimizer.step()
        self.actor_optimizer.zero_grad()
        return metrics
