"""Data-parallel PPO actor with a KL loss against the reference policy.

Modelled on the layout of verl's ``dp_actor.py`` / ``core_algos.py``: the
actor update reads ``kl_loss_type`` from its config and hands the log-probs
to the shared ``kl_penalty`` helper.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class ActorConfig:
    ppo_micro_batch_size: int = 4
    clip_ratio: float = 0.2
    use_kl_loss: bool = True
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "kl"
    loss_agg_mode: str = "token-mean"


def masked_mean(values, mask, axis=None):
    return (values * mask).sum(axis=axis) / (mask.sum(axis=axis) + 1e-8)


def agg_loss(loss_mat, loss_mask, loss_agg_mode):
    if loss_agg_mode == "token-mean":
        return masked_mean(loss_mat, loss_mask)
    if loss_agg_mode == "seq-mean-token-sum":
        return (loss_mat * loss_mask).sum(dim=-1).mean()
    raise ValueError(f"unknown loss_agg_mode {loss_agg_mode}")


def kl_penalty(logprob, ref_logprob, kl_penalty="low_var_kl"):
    """Per-token KL estimate between the actor and the reference."""
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty == "abs":
        return (logprob - ref_logprob).abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        kl = torch.clamp(ref_logprob - logprob, min=-20, max=20)
        kld = torch.exp(kl) - kl - 1
        return torch.clamp(kld, min=-10, max=10)
    raise NotImplementedError(kl_penalty)


def compute_policy_loss(old_log_prob, log_prob, advantages, response_mask, clip_ratio, loss_agg_mode):
    negative_approx_kl = log_prob - old_log_prob
    ratio = torch.exp(negative_approx_kl)
    pg_losses = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1.0 - clip_ratio, 1.0 + clip_ratio)
    pg_loss = agg_loss(torch.maximum(pg_losses, pg_losses2), response_mask, loss_agg_mode)
    pg_clipfrac = masked_mean(torch.gt(pg_losses2, pg_losses).float(), response_mask)
    return pg_loss, pg_clipfrac


class DataParallelPPOActor:
    def __init__(self, config: ActorConfig, actor_module, actor_optimizer):
        self.config = config
        self.actor_module = actor_module
        self.actor_optimizer = actor_optimizer

    def _forward_micro_batch(self, micro_batch, temperature=1.0):
        responses = micro_batch["responses"]
        response_length = responses.size(-1)
        output = self.actor_module(
            input_ids=micro_batch["input_ids"], attention_mask=micro_batch["attention_mask"]
        )
        logits = output.logits[:, -response_length - 1 : -1, :] / temperature
        log_probs = F.log_softmax(logits, dim=-1)
        return torch.gather(log_probs, -1, responses.unsqueeze(-1)).squeeze(-1)

    def update_policy(self, data):
        metrics = {"actor/pg_loss": [], "actor/kl_loss": []}
        batch_size = data["responses"].shape[0]
        micro_batches = [
            {k: v[i : i + self.config.ppo_micro_batch_size] for k, v in data.items()}
            for i in range(0, batch_size, self.config.ppo_micro_batch_size)
        ]
        grad_accum = len(micro_batches)
        self.actor_optimizer.zero_grad()
        for micro_batch in micro_batches:
            response_mask = micro_batch["response_mask"]
            old_log_prob = micro_batch["old_log_probs"]
            advantages = micro_batch["advantages"]

            log_prob = self._forward_micro_batch(micro_batch)
            pg_loss, pg_clipfrac = compute_policy_loss(
                old_log_prob, log_prob, advantages, response_mask,
                self.config.clip_ratio, self.config.loss_agg_mode,
            )
            policy_loss = pg_loss

            if self.config.use_kl_loss:
                ref_log_prob = micro_batch["ref_log_prob"]
                # error: KL001
                kld = kl_penalty(logprob=log_prob, ref_logprob=ref_log_prob, kl_penalty=self.config.kl_loss_type)
                kl_loss = agg_loss(kld, response_mask, self.config.loss_agg_mode)
                policy_loss = policy_loss + kl_loss * self.config.kl_loss_coef
                metrics["actor/kl_loss"].append(kl_loss.detach().item())

            loss = policy_loss / grad_accum
            loss.backward()
            metrics["actor/pg_loss"].append(pg_loss.detach().item())

        self.actor_optimizer.step()
        return metrics
