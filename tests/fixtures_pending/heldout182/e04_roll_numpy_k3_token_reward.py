# Reviewer: ROLL-style REINFORCE pipeline with the KL in the token rewards. The
# reward helper works on CPU numpy copies (`.detach().cpu().numpy()`, so no
# gradient, as a reward must be), but the per-token KL it writes is k3
# (`np.exp(ref - logp) - (ref - logp) - 1`, the "low variance" estimator). The
# rewards are turned into returns by a reverse cumulative sum (gamma = 1) and
# weight the log-probs in the policy-gradient loss: the KL part of the expected
# gradient is grad KL(pi||pi_ref) minus the token-level partial gradient of
# KL(pi_ref||pi) (biased).
# Verdict: bug, KL004, reported inside `compute_token_returns` (it makes the
# estimate into rewards itself) on its k3 line.
from dataclasses import dataclass

import numpy as np
import torch

from roll.pipeline.rlvr.rlvr_config import RLVRConfig
from roll.utils.functionals import masked_mean


@dataclass
class KLRewardConfig:
    init_kl_coef: float = 0.05
    gamma: float = 1.0
    whiten_returns: bool = False


@torch.no_grad()
def compute_token_returns(log_probs, ref_log_probs, response_mask, scores, cfg: KLRewardConfig):
    lp = log_probs.detach().double().cpu().numpy()
    ref = ref_log_probs.detach().double().cpu().numpy()
    mask = response_mask.detach().double().cpu().numpy()

    neg_log_ratio = ref - lp
    # error: KL004
    token_kl = np.exp(neg_log_ratio) - neg_log_ratio - 1.0
    rewards = -cfg.init_kl_coef * token_kl * mask

    last = mask.sum(axis=-1).astype(np.int64) - 1
    rewards[np.arange(rewards.shape[0]), last] += scores.detach().double().cpu().numpy()

    returns = np.zeros_like(rewards)
    running = np.zeros(rewards.shape[0])
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + cfg.gamma * running
        returns[:, t] = running
    returns = returns * mask
    out = torch.from_numpy(returns).to(device=log_probs.device, dtype=log_probs.dtype)
    return out, float((token_kl * mask).sum(-1).mean())


def policy_loss(log_probs, returns, response_mask):
    return -(returns * log_probs * response_mask).sum(-1).mean()


def actor_train_step(actor, optimizer, batch, cfg: KLRewardConfig):
    returns, kl_metric = compute_token_returns(
        batch["old_log_probs"], batch["ref_log_probs"], batch["response_mask"], batch["scores"], cfg
    )
    log_probs = actor.compute_log_probs(batch["input_ids"], batch["attention_mask"])
    loss = policy_loss(log_probs, returns, batch["response_mask"])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return {"actor/loss": loss.item(), "critic/kl": kl_metric}
