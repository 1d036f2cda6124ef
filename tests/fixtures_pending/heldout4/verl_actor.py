"""A verl-style data-parallel actor: PPO clipped loss plus an optional KL loss.

Each update trains on the responses just generated (ppo_epochs = 1), so the maths of
on-policy sampling applies. With ``logr_t = logp_t - ref_t`` per response token:

- low_var_kl (k3) as a loss, aggregated by ``agg_loss``: per-token gradient
  ``(1 - exp(-logr_t)) grad logp_t``, i.e. that of KL(pi_ref||pi) (KL002);
- ``"k3+"``: value of k3, gradient of k2 = ``logr_t grad logp_t`` per token, summed
  over the response: the token-level partial gradient of KL(pi||pi_ref) (KL003, not KL002);
- ``kl_to_go * log_prob`` with ``kl_to_go_t = sum_{s>=t} sg(logr_s)`` summed per
  sequence: the cumulative estimator, grad KL(pi||pi_ref) (quiet);
- k1 in the token rewards, credited by GAE with gamma = lam = 1 (returns): quiet.

Fixture: parsed by the tests, never executed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .verl_core_algos import agg_loss, compute_gae_advantage_return, compute_policy_loss, kl_penalty


@dataclass
class ActorConfig:
    ppo_mini_batch_size: int = 256
    clip_ratio: float = 0.2
    loss_agg_mode: str = "token-mean"
    use_kl_loss: bool = True
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    global_batch_info: dict = field(default_factory=dict)


@dataclass
class StraightThroughActorConfig(ActorConfig):
    kl_loss_type: str = "k3+"


class DataParallelPPOActor:
    def __init__(self, config: ActorConfig, actor_module, actor_optimizer):
        self.config = config
        self.actor_module = actor_module
        self.actor_optimizer = actor_optimizer

    def _forward_micro_batch(self, micro_batch):
        response_length = micro_batch["responses"].size(-1)
        logits = self.actor_module(input_ids=micro_batch["input_ids"], attention_mask=micro_batch["attention_mask"]).logits
        logits = logits[:, -response_length - 1 : -1, :]
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        return torch.gather(log_probs, -1, micro_batch["responses"].unsqueeze(-1)).squeeze(-1)

    def update_policy(self, data):
        metrics = {}
        for micro_batch in data.split(self.config.ppo_mini_batch_size):
            response_mask = micro_batch["response_mask"]
            old_log_prob = micro_batch["old_log_probs"]
            advantages = micro_batch["advantages"]
            log_prob = self._forward_micro_batch(micro_batch)

            pg_loss, ppo_kl = compute_policy_loss(
                old_log_prob=old_log_prob,
                log_prob=log_prob,
                advantages=advantages,
                response_mask=response_mask,
                cliprange=self.config.clip_ratio,
                loss_agg_mode=self.config.loss_agg_mode,
                **self.config.global_batch_info,
            )
            policy_loss = pg_loss
            if self.config.use_kl_loss:
                ref_log_prob = micro_batch["ref_log_prob"]
                # error: KL002
                kld = kl_penalty(logprob=log_prob, ref_logprob=ref_log_prob, kl_penalty=self.config.kl_loss_type)
                kl_loss = agg_loss(
                    loss_mat=kld,
                    loss_mask=response_mask,
                    loss_agg_mode=self.config.loss_agg_mode,
                    **self.config.global_batch_info,
                )
                policy_loss = policy_loss + kl_loss * self.config.kl_loss_coef
                metrics["actor/kl_loss"] = kl_loss.detach().item()
            policy_loss.backward()
            metrics["actor/ppo_kl"] = ppo_kl.item()
        self.actor_optimizer.step()
        return metrics


class StraightThroughKLActor(DataParallelPPOActor):
    """Logs k3 but differentiates k2: right per token, partial over the response."""

    def __init__(self, config: StraightThroughActorConfig, actor_module, actor_optimizer):
        super().__init__(config, actor_module, actor_optimizer)

    def update_policy(self, data):
        for micro_batch in data.split(self.config.ppo_mini_batch_size):
            response_mask = micro_batch["response_mask"]
            log_prob = self._forward_micro_batch(micro_batch)
            pg_loss, _ = compute_policy_loss(micro_batch["old_log_probs"], log_prob, micro_batch["advantages"], response_mask)
            # error: KL003
            # ok: KL001, KL002
            kld = kl_penalty(log_prob, micro_batch["ref_log_prob"], kl_penalty=self.config.kl_loss_type)
            kl_loss = agg_loss(
                loss_mat=kld,
                loss_mask=response_mask,
                loss_agg_mode="seq-mean-token-sum",
                **self.config.global_batch_info,
            )
            loss = pg_loss + self.config.kl_loss_coef * kl_loss
            loss.backward()
        self.actor_optimizer.step()


class KLToGoActor(DataParallelPPOActor):
    """The KL loss as the score function of the sequence KL, summed per response."""

    def update_policy(self, data):
        for micro_batch in data.split(self.config.ppo_mini_batch_size):
            response_mask = micro_batch["response_mask"]
            log_prob = self._forward_micro_batch(micro_batch)
            pg_loss, _ = compute_policy_loss(micro_batch["old_log_probs"], log_prob, micro_batch["advantages"], response_mask)
            # ok: KL001, KL002, KL003, KL004, KL005, KL006
            log_ratio = ((log_prob - micro_batch["ref_log_prob"]) * response_mask).detach()
            kl_to_go = torch.flip(torch.cumsum(torch.flip(log_ratio, dims=[-1]), dim=-1), dims=[-1])
            # ok: KL001, KL002, KL003, KL004, KL005, KL006
            kl_surrogate = kl_to_go * log_prob
            kl_loss = agg_loss(
                loss_mat=kl_surrogate,
                loss_mask=response_mask,
                loss_agg_mode="seq-mean-token-sum",
                **self.config.global_batch_info,
            )
            (pg_loss + self.config.kl_loss_coef * kl_loss).backward()
        self.actor_optimizer.step()


@torch.no_grad()
def apply_kl_penalty(data, kl_coef: float = 0.001, kl_penalty_type: str = "kl", gamma: float = 1.0, lam: float = 1.0):
    """In-reward KL (use_kl_in_reward): k1 of the rollout log-probs, credited by GAE returns."""
    response_mask = data["response_mask"]
    # ok: KL001, KL002, KL003, KL004, KL005, KL006
    kld = kl_penalty(data["old_log_probs"], data["ref_log_prob"], kl_penalty=kl_penalty_type)
    token_level_rewards = data["token_level_scores"] - kl_coef * kld * response_mask
    advantages, returns = compute_gae_advantage_return(token_level_rewards, data["values"], response_mask, gamma, lam)
    data["advantages"] = advantages
    data["returns"] = returns
    return data
