# Reviewer: oat-style learner with a frozen `copy.deepcopy` snapshot of the
# policy, like e02, used to fight forgetting by replay: the responses are
# sampled from the snapshot (`self.ema.generate`), not from the policy. The
# helper, called once with logits only, returns `log(q / p)` (snapshot first).
# Minimised on the snapshot's own samples, sum_t log(q_t / p_t) is the
# snapshot's log-prob minus the policy's: its gradient is
# -E_q[sum_t grad log p_t] = grad KL(pi_snapshot||pi) of the sequence, exactly,
# because the sampling distribution does not depend on the policy
# (sequence-level distillation on the teacher's outputs).
# Verdict: correct. Nothing to report on the `log(q / p)` line.
import copy
from dataclasses import dataclass

import torch

from oat.learners.base import LearnerBase
from oat.utils.data import zero_pad_sequences


@dataclass
class AnchorArgs:
    ema_decay: float = 0.995
    anchor_coef: float = 0.05
    max_new_tokens: int = 128


class EMAReplayLearner:
    def __init__(self, policy, args: AnchorArgs = AnchorArgs()):
        self.args = args
        self.policy = policy
        self.ema = copy.deepcopy(policy).eval()
        for p in self.ema.parameters():
            p.requires_grad_(False)

    @torch.no_grad()
    def update_ema(self):
        for p_ema, p in zip(self.ema.parameters(), self.policy.parameters()):
            p_ema.mul_(self.args.ema_decay).add_(p.detach(), alpha=1 - self.args.ema_decay)

    def _token_divergence(self, logits, other_logits, ids):
        p = torch.softmax(logits, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
        q = torch.softmax(other_logits, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
        # ok: KL001
        return torch.log(q / p)

    def replay_loss(self, input_ids, response_ids, response_mask):
        mask = response_mask.to(torch.float64)
        n = response_ids.size(1)
        logits = self.policy(input_ids=input_ids).logits[:, -n - 1 : -1]
        with torch.no_grad():
            other_logits = self.ema(input_ids=input_ids).logits[:, -n - 1 : -1]
        div = self._token_divergence(logits, other_logits, response_ids)
        anchor_loss = (div * mask).sum(-1).mean()
        return self.args.anchor_coef * anchor_loss, {"replay_kl": anchor_loss.detach()}

    def step(self, prompts, optimizer):
        with torch.no_grad():
            out = self.ema.generate(prompts, max_new_tokens=self.args.max_new_tokens, do_sample=True)
        response_ids = out[:, prompts.size(1):]
        response_mask = torch.ones_like(response_ids)
        loss, info = self.replay_loss(out, response_ids, response_mask)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return info
