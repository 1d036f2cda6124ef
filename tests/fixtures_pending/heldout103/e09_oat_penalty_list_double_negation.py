# Reviewer: oat-style REINFORCE learner. Token rewards are the outcome score
# minus a list of per-token penalties: `penalty_fns` is built from
# `args.reward_penalties`, each function gets the batch and returns a [B, T]
# *penalty* (positive = bad), and `rewards = outcome - sum(penalties)`. The
# "kl" penalty function, however, returns `kl_coef * (ref - logp)`, the
# reward-shaped `-beta * k1` copied from a reward function. Subtracting it
# again adds `+beta * (logp - ref)` to the rewards; returns are the reverse
# cumulative sum and weight the log-probs.
# Verdict: bug (KL006). Two minus signs: the KL enters the reward as a bonus,
# so the expected gradient of the loss is -beta * grad KL(pi||pi_ref) and the
# policy is pushed away from the reference.
import functools
from typing import Callable, Dict, List

import torch

from oat.args import OATArgs  # noqa: F401
from oat.learners.rl import RLLearner


@torch.no_grad()
def kl_penalty(batch, kl_coef: float):
    # error: KL006
    kl = batch["ref_logps"] - batch["behavior_logps"]
    return kl_coef * kl * batch["loss_masks"]


@torch.no_grad()
def length_penalty(batch, coef: float, target_len: int):
    lens = batch["loss_masks"].sum(-1, keepdim=True)
    over = (lens - target_len).clamp(min=0) / target_len
    pen = torch.zeros_like(batch["loss_masks"])
    pen[torch.arange(pen.shape[0]), lens.squeeze(-1).long() - 1] = coef * over.squeeze(-1)
    return pen


def build_penalties(args) -> List[Callable]:
    table: Dict[str, Callable] = {
        "kl": functools.partial(kl_penalty, kl_coef=args.kl_coef),
        "length": functools.partial(length_penalty, coef=args.length_coef, target_len=args.target_len),
    }
    return [table[name] for name in args.reward_penalties]


@torch.no_grad()
def shaped_returns(batch, penalty_fns):
    mask = batch["loss_masks"]
    outcome = torch.zeros_like(mask)
    last = mask.sum(-1).long() - 1
    outcome[torch.arange(mask.shape[0]), last] = batch["rewards"]
    penalties = [fn(batch) for fn in penalty_fns]
    rewards = outcome - sum(penalties)
    return (rewards * mask).flip(-1).cumsum(-1).flip(-1)


def reinforce_loss(logps, returns, mask):
    return -(returns * logps * mask).sum(-1).mean()


class ShapedReinforceLearner(RLLearner):
    def __init__(self, args):
        super().__init__(args)
        self.penalty_fns = build_penalties(args)

    def learning_step(self, batch):
        logits = self.model(batch["input_ids"], attention_mask=batch["att_mask"]).logits[:, :-1]
        logps = torch.gather(logits.log_softmax(-1), 2, batch["input_ids"][:, 1:, None]).squeeze(-1)
        batch["behavior_logps"] = logps.detach()
        returns = shaped_returns(batch, self.penalty_fns)
        loss = reinforce_loss(logps, returns, batch["loss_masks"])
        self.strategy.backward(loss, self.model, self.optimizer)
        self.strategy.optimizer_step(self.optimizer, self.model, self.scheduler)
        return {"loss": loss.item(), "return": returns[:, 0].mean().item()}
