# Reviewer: verl-style in-reward KL. The token KL function is named in the algorithm
# config by a dotted path, "<module>.token_log_ratio", split on the last dot and
# imported at run time. token_log_ratio(logprob, ref_logprob) is k1, the right KL
# reward. But apply_kl_penalty calls it POSITIONALLY with the arguments swapped,
# kl_fn(ref_log_prob, old_log_probs), so kld = ref - logp = -logr; the reward
# scores - beta * kld is then scores + beta * logr: a KL BONUS. Credited by returns
# (reverse cumsum) and minimised as -(returns * logp), its gradient is
# -beta * grad KL(pi||pi_ref) of the sequence.
# Verdict: bug, KL006, reported inside apply_kl_penalty on the `kld = kl_fn(...)` line
# (the helper makes the rewards itself; the function comes from the config).
import importlib
from dataclasses import dataclass

import torch

from verl import DataProto
from verl.trainer.ppo.core_algos import AdaptiveKLController


@dataclass
class AlgoConfig:
    kl_penalty_fn: str = f"{__name__}.token_log_ratio"
    kl_coef: float = 0.05
    use_kl_in_reward: bool = True


def import_from_string(path: str):
    module_path, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module_path), name)


def token_log_ratio(logprob, ref_logprob):
    """k1: log pi(y_t|y_<t) - log pi_ref(y_t|y_<t)."""
    return logprob - ref_logprob


def token_low_var_kl(logprob, ref_logprob):
    kl = (ref_logprob - logprob).clamp(-20, 20)
    # ok: KL004
    return kl.exp() - kl - 1


@torch.no_grad()
def apply_kl_penalty(data: dict, kl_fn, kl_coef: float):
    response_mask = data["response_mask"]
    token_level_scores = data["token_level_scores"]
    # error: KL006
    kld = kl_fn(data["ref_log_prob"], data["old_log_probs"])
    token_level_rewards = token_level_scores - kl_coef * kld * response_mask
    returns = (token_level_rewards * response_mask).flip(-1).cumsum(-1).flip(-1)
    data["returns"] = returns
    data["kl_metric"] = (kld * response_mask).sum(-1).mean()
    return data


def compute_actor_loss(log_prob, returns, response_mask):
    return -(returns * log_prob * response_mask).sum(-1).mean()


class RayPPOTrainer:
    def __init__(self, config: AlgoConfig = AlgoConfig()):
        self.config = config
        self.kl_fn = import_from_string(config.kl_penalty_fn)

    def fit_step(self, batch: dict, actor):
        if self.config.use_kl_in_reward:
            batch = apply_kl_penalty(batch, self.kl_fn, self.config.kl_coef)
        else:
            batch["returns"] = batch["token_level_scores"].flip(-1).cumsum(-1).flip(-1)
        log_prob = actor.compute_log_prob(batch)
        loss = compute_actor_loss(log_prob, batch["returns"], batch["response_mask"])
        loss.backward()
        actor.optimizer.step()
        actor.optimizer.zero_grad()
        return {"critic/kl": batch["kl_metric"].item(), "actor/loss": loss.item()}
