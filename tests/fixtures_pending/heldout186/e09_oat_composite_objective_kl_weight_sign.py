# Reviewer: oat-style learner whose update is a CompositeObjective, a weighted
# sum of nn.Module terms that the learner MAXIMISES (loss = -objective). The
# policy term returns the clipped surrogate objective (advantage-weighted, to
# be maximised). The KL term SeqKLTerm returns a correct score-function penalty
# (detached KL-to-go times the log-probs), but it is registered with a positive
# weight, (+beta, SeqKLTerm()), as if the container were a loss. After the
# learner's negation the KL enters the minimised loss as -beta * KL: its
# gradient is -beta * grad KL(pi||pi_ref), so training increases the KL.
# Verdict: bug, KL006, reported inside SeqKLTerm.forward (given only the batch,
# called from one place) on the line that multiplies the detached KL-to-go by
# the log-probs, named as the penalty.
from dataclasses import dataclass

import torch
import torch.nn as nn

from oat.learners.base import LearnerBase
from oat.types import TrajectoryData


@dataclass
class PPOArgs:
    beta: float = 0.05
    clip_range: float = 0.2


class PGObjective(nn.Module):
    def __init__(self, clip_range: float):
        super().__init__()
        self.clip_range = clip_range

    def forward(self, batch):
        ratio = torch.exp(batch["logps"] - batch["old_logps"])
        adv = batch["advantages"].unsqueeze(-1)
        surr = torch.min(ratio * adv, ratio.clamp(1 - self.clip_range, 1 + self.clip_range) * adv)
        return (surr * batch["mask"]).sum(-1).mean()


class SeqKLTerm(nn.Module):
    def forward(self, batch):
        logps, mask = batch["logps"], batch["mask"]
        log_ratio = (logps - batch["ref_logps"]).detach() * mask
        kl_to_go = log_ratio.flip(-1).cumsum(-1).flip(-1)
        # error: KL006
        kl_penalty = (kl_to_go * logps * mask).sum(-1)
        return kl_penalty.mean()


class CompositeObjective(nn.Module):
    """Weighted sum of objective terms; the learner maximises it."""

    def __init__(self, terms):
        super().__init__()
        self.weights = [w for w, _ in terms]
        self.terms = nn.ModuleList([t for _, t in terms])

    def forward(self, batch):
        return sum(w * term(batch) for w, term in zip(self.weights, self.terms))


def build_objective(args: PPOArgs) -> CompositeObjective:
    terms = [(1.0, PGObjective(args.clip_range))]
    if args.beta > 0:
        terms.append((args.beta, SeqKLTerm()))
    return CompositeObjective(terms)


class PPOLearner(LearnerBase):
    def _init(self, args: PPOArgs, actor, ref_actor, optimizer):
        self.args = args
        self.actor, self.ref_actor, self.optimizer = actor, ref_actor, optimizer
        self.objective = build_objective(args)

    def _logps(self, model, traj: TrajectoryData):
        logits = model(traj.input_ids, attention_mask=traj.attention_mask).logits[:, :-1]
        return torch.gather(logits.log_softmax(-1), 2, traj.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)

    def learning_step(self, traj: TrajectoryData):
        logps = self._logps(self.actor, traj)
        with torch.no_grad():
            ref_logps = self._logps(self.ref_actor, traj)
        batch = {"logps": logps, "old_logps": traj.old_logps, "ref_logps": ref_logps,
                 "advantages": traj.advantages, "mask": traj.loss_masks[:, 1:].float()}
        loss = -self.objective(batch)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {"loss": loss.item()}
