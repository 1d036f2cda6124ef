# Reviewer: verl-style actor. The KL helper kl_penalty(logprob, ref_logprob,
# kl_penalty=...) is bound with functools.partial to the configured estimator
# (ActorConfig.kl_loss_type, default "kl") and then wrapped in _TrackedFn, a
# callable that uses functools.update_wrapper and records the mean of what it
# returns. The wrapper changes nothing: the loss receives k1 = logp - ref with
# its gradient, summed over the response tokens: zero expected gradient.
# Verdict: bug, KL001, reported where compute_policy_loss calls self.kl_fn.
import functools
from dataclasses import dataclass

import torch

from verl import DataProto
from verl.utils.torch_functional import logprobs_from_logits


def kl_penalty(logprob, ref_logprob, kl_penalty: str = "low_var_kl"):
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        kl = (ref_logprob - logprob).clamp(-20, 20)
        # ok: KL002
        return torch.exp(kl) - kl - 1
    raise NotImplementedError(kl_penalty)


class _TrackedFn:
    """Callable proxy that keeps the wrapped function's metadata and its last mean."""

    def __init__(self, fn, metric_name):
        functools.update_wrapper(self, fn)
        self.metric_name = metric_name
        self.last_mean = None

    def __call__(self, *args, **kwargs):
        out = self.__wrapped__(*args, **kwargs)
        self.last_mean = out.detach().mean().item()
        return out


@dataclass
class ActorConfig:
    clip_ratio: float = 0.2
    use_kl_loss: bool = True
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "kl"
    ppo_micro_batch_size: int = 4


class DataParallelPPOActor:
    def __init__(self, config: ActorConfig, actor_module=None, actor_optimizer=None):
        self.config = config
        self.actor_module = actor_module
        self.actor_optimizer = actor_optimizer
        self.kl_fn = _TrackedFn(functools.partial(kl_penalty, kl_penalty=config.kl_loss_type), "actor/kl_loss")

    def compute_policy_loss(self, log_prob, old_log_prob, ref_log_prob, advantages, response_mask):
        cfg = self.config
        ratio = torch.exp(log_prob - old_log_prob)
        pg_losses = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(1 - cfg.clip_ratio, 1 + cfg.clip_ratio))
        policy_loss = (pg_losses * response_mask).sum(-1).mean()
        metrics = {}
        if cfg.use_kl_loss:
            # error: KL001
            kld = self.kl_fn(log_prob, ref_log_prob)
            kl_loss = (kld * response_mask).sum(-1).mean()
            policy_loss = policy_loss + cfg.kl_loss_coef * kl_loss
            metrics[self.kl_fn.metric_name] = self.kl_fn.last_mean
        return policy_loss, metrics

    def update_policy(self, data: DataProto):
        self.actor_module.train()
        metrics = {}
        for mb in data.split(self.config.ppo_micro_batch_size):
            out = self.actor_module(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"])
            log_prob = logprobs_from_logits(out.logits[:, -mb["responses"].shape[-1] - 1 : -1], mb["responses"])
            loss, m = self.compute_policy_loss(log_prob, mb["old_log_probs"], mb["ref_log_prob"], mb["advantages"], mb["response_mask"])
            loss.backward()
            metrics.update(m)
        self.actor_optimizer.step()
        self.actor_optimizer.zero_grad()
        return metrics
