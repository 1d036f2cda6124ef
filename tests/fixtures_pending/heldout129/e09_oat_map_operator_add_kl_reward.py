# Reviewer: oat-style PPO learner without a critic. Per-token rewards are built
# step by step with map(): the KL reward kl_coef * (logp - ref) of each step
# (functools.partial(operator.mul, kl_coef) mapped over the steps) is
# combined with the score rewards by map(operator.add, ...), i.e. the KL is
# ADDED to the rewards as a bonus, then credited by reward-to-go returns
# (itertools.accumulate over the reversed steps). Expected gradient of the loss:
# -kl_coef * grad KL(pi||pi_ref): the policy is pushed away from the reference.
# Verdict: bug, KL006, reported inside compute_token_rewards on the estimate line.
import functools
import itertools
import operator
from dataclasses import dataclass

import torch

from oat.args import PPOArgs
from oat.learners.rl import RLLearner


@dataclass
class KLRewardArgs(PPOArgs):
    kl_penalty_coef: float = 0.05
    reinforce_update: bool = True


@torch.no_grad()
def compute_token_rewards(scores, logps, ref_logps, response_masks, kl_coef):
    # error: KL006
    kl = operator.sub(logps, ref_logps) * response_masks
    last = response_masks.sum(-1).long() - 1
    score_rewards = torch.zeros_like(kl).scatter_(-1, last[:, None], scores[:, None].to(kl.dtype))
    kl_rewards = map(functools.partial(operator.mul, kl_coef), kl.unbind(-1))
    steps = list(map(operator.add, score_rewards.unbind(-1), kl_rewards))
    returns = list(itertools.accumulate(reversed(steps)))[::-1]
    return torch.stack(returns, dim=-1) * response_masks


class KLRewardPPOLearner(RLLearner):
    def __init__(self, args: KLRewardArgs, model, ref_model, optimizer):
        self.args = args
        self.model, self.ref_model, self.optimizer = model, ref_model, optimizer

    def _logps(self, model, input_ids, att_mask, n):
        logits = model(input_ids, attention_mask=att_mask).logits[:, -n - 1 : -1].float()
        return torch.gather(logits.log_softmax(-1), -1, input_ids[:, -n:, None]).squeeze(-1)

    def learn(self, input_ids, att_mask, response_masks, scores):
        n = response_masks.shape[1]
        with torch.no_grad():
            logps = self._logps(self.model, input_ids, att_mask, n)
            ref_logps = self._logps(self.ref_model, input_ids, att_mask, n)
            returns = compute_token_rewards(scores, logps, ref_logps, response_masks, self.args.kl_penalty_coef)
        new_logps = self._logps(self.model, input_ids, att_mask, n)
        loss = self.pg_loss(new_logps, logps, returns, response_masks)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {"loss": loss.item(), "mean_return": returns[:, 0].mean().item()}

    @staticmethod
    def pg_loss(new_logps, old_logps, returns, response_masks):
        ratio = torch.exp(new_logps - old_logps)
        return -(ratio * returns * response_masks).sum(-1).mean()
