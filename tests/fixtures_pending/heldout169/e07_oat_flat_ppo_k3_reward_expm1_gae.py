# Reviewer: an oat-style minimal PPO script (one module, critic + GAE with
# GAMMA = LAM = 1). `compute_rewards`, under torch.no_grad(), subtracts a
# per-token KL reward from the token rewards; the estimate is k3 written as
# expm1(ref - logp) - (ref - logp). Credited by GAE returns, its expected
# gradient is grad KL(pi||pi_ref) minus the token-level partial of
# grad KL(pi_ref||pi): biased, nearly zero near the reference.
# Verdict: bug, KL004, reported inside compute_rewards on the k3 line.
import torch
from oat.actors import PPOActor
from oat.learners.base import LearnerBase

# ---- configuration globals -------------------------------------------------
KL_COEF = 0.02
GAMMA = 1.0
LAM = 1.0
CLIP = 0.2
MAX_LEN = 512


@torch.no_grad()
def compute_rewards(scores, logps, ref_logps, mask):
    # error: KL004
    kl = torch.expm1(ref_logps - logps) - (ref_logps - logps)
    rewards = -KL_COEF * kl * mask
    last = mask.sum(-1).long() - 1
    rewards[torch.arange(rewards.shape[0]), last] += scores
    return rewards


@torch.no_grad()
def gae(rewards, values, mask):
    T = rewards.shape[1]
    adv = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(T)):
        next_v = values[:, t + 1] if t + 1 < T else torch.zeros_like(last)
        delta = rewards[:, t] + GAMMA * next_v * mask[:, t] - values[:, t]
        last = delta + GAMMA * LAM * last
        adv[:, t] = last
    return adv * mask, (adv + values) * mask


def policy_loss(logps, old_logps, adv, mask):
    ratio = torch.exp(logps - old_logps)
    loss = -torch.min(ratio * adv, ratio.clamp(1 - CLIP, 1 + CLIP) * adv)
    return (loss * mask).sum() / (mask.shape[0] * MAX_LEN)


if __name__ == "__main__":
    actor = PPOActor("Qwen/Qwen2.5-Math-1.5B")
    learner = LearnerBase(actor)
    for rollout in actor.rollouts():
        logps, mask = learner.logps(rollout), rollout["mask"]
        rewards = compute_rewards(rollout["scores"], logps.detach(), rollout["ref_logps"], mask)
        adv, returns = gae(rewards, rollout["values"], mask)
        loss = policy_loss(logps, logps.detach(), adv, mask)
        loss.backward()
        learner.step()
