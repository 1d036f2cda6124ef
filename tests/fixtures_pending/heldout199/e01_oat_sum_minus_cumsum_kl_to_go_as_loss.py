# Reviewer: oat-style PPO learner with a "cumulative KL" loss. The author wanted
# the KL-to-go of the sequence estimator and spelled the reverse cumulative sum
# as x.sum(-1, keepdim=True) - x.cumsum(-1) + x (= sum_{s>=t} x_s). But x is the
# log-ratio logp - ref WITH its gradient, and the KL-to-go itself is summed into
# the loss instead of weighting the log-probs. The loss is therefore the
# positively weighted k1 sum sum_s (s+1) * logr_s, whose autograd gradient is
# sum_s (s+1) * grad logp_s: zero in expectation (E[grad logp_s | y_<s] = 0).
# The KL term regularises nothing.
# Verdict: bug, KL001, reported where the log-ratio (the k1 estimate) is computed.
from dataclasses import dataclass

import torch

from oat.learners.base import LearnerBase
from oat.types import TrajectoryData


@dataclass
class PPOArgs:
    clip_range_low: float = 0.2
    clip_range_high: float = 0.28
    beta: float = 0.05
    num_ppo_epochs: int = 1
    max_grad_norm: float = 1.0


class CumulativeKLLearner(LearnerBase):
    def __init__(self, args: PPOArgs, model=None, optimizer=None):
        self.args = args
        self.model = model
        self.optimizer = optimizer

    def compute_logps(self, input_ids, attention_mask, response_len):
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask).logits
        logits = logits[:, -response_len - 1 : -1].float()
        labels = input_ids[:, -response_len:]
        return torch.gather(logits.log_softmax(-1), 2, labels.unsqueeze(-1)).squeeze(-1)

    def policy_loss(self, logps, old_logps, ref_logps, advantages, response_masks):
        args = self.args
        ratio = torch.exp(logps - old_logps)
        pg1 = -advantages * ratio
        pg2 = -advantages * torch.clamp(ratio, 1.0 - args.clip_range_low, 1.0 + args.clip_range_high)
        pg_loss = (torch.max(pg1, pg2) * response_masks).sum(-1).mean()

        # KL-to-go: sum over the current and all later response tokens
        # error: KL001
        log_ratio = (logps - ref_logps) * response_masks
        kl_to_go = log_ratio.sum(-1, keepdim=True) - log_ratio.cumsum(-1) + log_ratio
        kl_loss = (kl_to_go * response_masks).sum(-1).mean()

        loss = pg_loss + args.beta * kl_loss
        infos = {
            "pg_loss": pg_loss.detach(),
            "kl_loss": kl_loss.detach(),
            "seq_kl": log_ratio.detach().sum(-1).mean(),
        }
        return loss, infos

    def learn(self, trajectory: TrajectoryData):
        stats = {}
        for _ in range(self.args.num_ppo_epochs):
            logps = self.compute_logps(trajectory.input_ids, trajectory.attention_mask, trajectory.response_len)
            loss, infos = self.policy_loss(
                logps,
                trajectory.old_logps,
                trajectory.ref_logps,
                trajectory.advantages.unsqueeze(-1),
                trajectory.response_masks,
            )
            self.optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.args.max_grad_norm)
            self.optimizer.step()
            stats.update({k: v.item() for k, v in infos.items()})
        return stats
