"""oat-style learner: the KL term is a callable parameter; without one, a closure over the mask is used."""

from dataclasses import dataclass
from typing import Callable, Optional

import torch


def reverse_cumsum(x: torch.Tensor) -> torch.Tensor:
    return x.flip(-1).cumsum(-1).flip(-1)


@dataclass
class LearnerArgs:
    beta: float = 0.05
    clip_eps: float = 0.2


class PolicyLearner:
    def __init__(self, model, args: LearnerArgs):
        self.model = model
        self.args = args

    def token_logps(self, input_ids, response_ids):
        logits = self.model(input_ids).logits[:, -response_ids.size(1) - 1 : -1]
        return torch.log_softmax(logits, dim=-1).gather(-1, response_ids.unsqueeze(-1)).squeeze(-1)

    def policy_loss(
        self,
        logps: torch.Tensor,
        old_logps: torch.Tensor,
        ref_logps: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        kl_fn: Optional[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = None,
    ) -> torch.Tensor:
        ratio = torch.exp(logps - old_logps)
        surr1 = ratio * advantages.unsqueeze(-1)
        surr2 = ratio.clamp(1 - self.args.clip_eps, 1 + self.args.clip_eps) * advantages.unsqueeze(-1)
        pg = (-torch.min(surr1, surr2) * mask).sum(-1)

        if kl_fn is None:

            def kl_fn(cur, base):
                # log(pi_ref / pi) per token, credited to every earlier token (reward-to-go)
                log_ratio = (base - cur).detach() * mask
                return (reverse_cumsum(log_ratio) * cur * mask).sum(-1)

        # error: KL006
        kl = kl_fn(logps, ref_logps)
        loss = (pg + self.args.beta * kl).mean()
        return loss

    def learn_step(self, batch, optimizer=None):
        logps = self.token_logps(batch["input_ids"], batch["response_ids"])
        old_logps = batch.get("old_logps")
        old_logps = logps.detach() if old_logps is None else old_logps
        loss = self.policy_loss(logps, old_logps, batch["ref_logps"], batch["advantages"], batch["mask"])
        loss.backward()
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad()
        return loss.detach()
