"""A TinyZero-style actor update: PPO loss, entropy bonus and a KL loss, micro-batched.

Three versions of the same update, differing only in how the KL term enters:

- ``pg_loss - entropy * c_ent - kl_loss * c_kl`` with low_var_kl: the k3 loss
  (KL002: its gradient is that of KL(pi_ref||pi)) *and* subtracted from a minimised
  loss (KL006: descent increases the divergence). Both defects hold by the maths;
- ``pg_loss - entropy * c_ent + kl_loss * c_kl`` with low_var_kl: KL002 only; the
  subtracted entropy term is a bonus on purpose and is not a KL;
- the same signs with the reward-to-go score function in place of k3: quiet.

Fixture: parsed by the tests, never executed.
"""

from __future__ import annotations

import torch


def kl_penalty(logprob, ref_logprob, kl_penalty: str = "low_var_kl"):
    if kl_penalty == "kl":
        return logprob - ref_logprob
    if kl_penalty == "mse":
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty == "low_var_kl":
        kl = ref_logprob - logprob
        ratio = torch.exp(kl)
        kld = (ratio - kl - 1).contiguous()
        return torch.clamp(kld, min=-10, max=10)
    raise NotImplementedError


def masked_mean(values, mask, axis=None):
    return (values * mask).sum(axis=axis) / mask.sum(axis=axis)


def entropy_from_logits(logits):
    pd = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - torch.sum(pd * logits, dim=-1)


class ActorConfig:
    kl_loss_type: str = "low_var_kl"
    kl_loss_coef: float = 0.001
    entropy_coeff: float = 0.001
    clip_ratio: float = 0.2
    grad_accum: int = 4


class DataParallelActor:
    def __init__(self, config: ActorConfig, module, optimizer):
        self.config = config
        self.module = module
        self.optimizer = optimizer

    def _forward(self, micro_batch):
        response_length = micro_batch["responses"].size(-1)
        logits = self.module(micro_batch["input_ids"], attention_mask=micro_batch["attention_mask"]).logits
        logits = logits[:, -response_length - 1 : -1]
        log_prob = torch.gather(logits.log_softmax(-1), -1, micro_batch["responses"].unsqueeze(-1)).squeeze(-1)
        return entropy_from_logits(logits), log_prob

    def _pg_loss(self, micro_batch, log_prob):
        ratio = torch.exp(log_prob - micro_batch["old_log_probs"])
        adv = micro_batch["advantages"]
        clipped = torch.clamp(ratio, 1.0 - self.config.clip_ratio, 1.0 + self.config.clip_ratio)
        return masked_mean(torch.max(-adv * ratio, -adv * clipped), micro_batch["response_mask"])

    def update_policy(self, micro_batches):
        for micro_batch in micro_batches:
            response_mask = micro_batch["response_mask"]
            entropy, log_prob = self._forward(micro_batch)
            pg_loss = self._pg_loss(micro_batch, log_prob)
            entropy_loss = masked_mean(entropy, response_mask)
            # error: KL002, KL006
            kld = kl_penalty(logprob=log_prob, ref_logprob=micro_batch["ref_log_prob"], kl_penalty=self.config.kl_loss_type)
            kl_loss = masked_mean(kld, response_mask)
            policy_loss = pg_loss - entropy_loss * self.config.entropy_coeff - kl_loss * self.config.kl_loss_coef
            loss = policy_loss / self.config.grad_accum
            loss.backward()
        self.optimizer.step()

    def update_policy_fixed_sign(self, micro_batches):
        for micro_batch in micro_batches:
            response_mask = micro_batch["response_mask"]
            entropy, log_prob = self._forward(micro_batch)
            pg_loss = self._pg_loss(micro_batch, log_prob)
            entropy_loss = masked_mean(entropy, response_mask)
            # error: KL002
            # ok: KL006
            kld = kl_penalty(logprob=log_prob, ref_logprob=micro_batch["ref_log_prob"], kl_penalty=self.config.kl_loss_type)
            kl_loss = masked_mean(kld, response_mask)
            policy_loss = pg_loss - entropy_loss * self.config.entropy_coeff + kl_loss * self.config.kl_loss_coef
            (policy_loss / self.config.grad_accum).backward()
        self.optimizer.step()

    def update_policy_kl_to_go(self, micro_batches):
        for micro_batch in micro_batches:
            response_mask = micro_batch["response_mask"]
            entropy, log_prob = self._forward(micro_batch)
            pg_loss = self._pg_loss(micro_batch, log_prob)
            entropy_loss = masked_mean(entropy, response_mask)
            # ok: KL001, KL002, KL003, KL004, KL005, KL006
            log_ratio = (log_prob - micro_batch["ref_log_prob"]).detach() * response_mask
            kl_to_go = torch.flip(torch.cumsum(torch.flip(log_ratio, [1]), 1), [1])
            # ok: KL001, KL002, KL003, KL004, KL005, KL006
            kl_loss = (kl_to_go * log_prob * response_mask).sum(-1).mean()
            policy_loss = pg_loss - entropy_loss * self.config.entropy_coeff + kl_loss * self.config.kl_loss_coef
            (policy_loss / self.config.grad_accum).backward()
        self.optimizer.step()
