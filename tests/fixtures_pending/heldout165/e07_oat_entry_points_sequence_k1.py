# Reviewer: oat-style learner. KL estimators are plugins: built-ins of this file, plus
# any package advertising the "oat.kl_estimators" entry-point group, loaded through
# importlib.metadata.entry_points(). The default --kl-estimator is "k1", the built-in
# SequenceLogRatio: the masked sum of logp_t - ref_t over the response, i.e. k1 of the
# sequence. It is added to the loss with its gradient; on the policy's own samples
# E[grad sum_t logp_t] = 0, so the KL term has zero expected gradient.
# Verdict: bug, KL001, reported on the `kl = self.kl_estimator(...)` call in
# PolicyLearner.compute_loss (the plugin returns the estimate; the loss calls it).
from dataclasses import dataclass
from importlib.metadata import entry_points

import torch

from oat.learners.base import LearnerBase
from oat.types import TrajectoryData


class SequenceLogRatio:
    def __call__(self, first_logps, second_logps, mask):
        return ((first_logps - second_logps) * mask).sum(-1)


class SequenceSquaredLogRatio:
    def __call__(self, first_logps, second_logps, mask):
        return 0.5 * ((first_logps - second_logps) * mask).sum(-1).square()


BUILTIN_KL_ESTIMATORS = {"k1": SequenceLogRatio, "k2": SequenceSquaredLogRatio}


def load_kl_estimators(group: str = "oat.kl_estimators"):
    registry = dict(BUILTIN_KL_ESTIMATORS)
    for ep in entry_points(group=group):
        registry[ep.name] = ep.load()
    return registry


@dataclass
class PPOArgs:
    beta: float = 0.05
    kl_estimator: str = "k1"
    critic_type: str = "grpo"


class PolicyLearner:  # LearnerBase in oat
    def __init__(self, args: PPOArgs = PPOArgs()):
        self.args = args
        registry = load_kl_estimators()
        self.kl_estimator = registry[args.kl_estimator]()

    def compute_loss(self, logps, ref_logps, advantages, response_masks):
        seq_logps = (logps * response_masks).sum(-1)
        pg_loss = -(advantages * seq_logps).mean()
        # error: KL001
        kl = self.kl_estimator(logps, ref_logps, response_masks)
        loss = pg_loss + self.args.beta * kl.mean()
        return loss, {"kl": kl.detach().mean()}

    def learning_step(self, trajectory: TrajectoryData, model, ref_logps, optimizer):
        logits = model(trajectory.input_ids, attention_mask=trajectory.attention_mask).logits[:, :-1]
        logps = torch.gather(logits.log_softmax(-1), 2, trajectory.input_ids[:, 1:, None]).squeeze(-1)
        masks = trajectory.response_masks[:, 1:]
        loss, info = self.compute_loss(logps, ref_logps, trajectory.advantages, masks)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return info
