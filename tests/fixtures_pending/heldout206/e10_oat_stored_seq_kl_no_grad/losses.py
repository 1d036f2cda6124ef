"""Learner loss: policy gradient on stored advantages plus the stored KL."""
import torch

from oat.utils.ops import masked_sum

from .advantages import compute_advantages, summarize


def pg_kl_loss(new_logps: torch.Tensor, batch: dict, args) -> torch.Tensor:
    mask = batch["response_mask"]
    ratio = torch.exp(new_logps - batch["logps"])
    adv = batch["advantages"]
    pg = -torch.min(ratio * adv, ratio.clamp(1 - args.cliprange, 1 + args.cliprange) * adv)
    pg_loss = ((pg * mask).sum(-1) / args.generate_max_length).mean()
    kl_loss = batch["kl"].mean()
    return pg_loss + args.beta * kl_loss


class PolicyGradientLearner:
    def __init__(self, args, model=None, optimizer=None):
        self.args = args
        self.model = model
        self.optimizer = optimizer

    def learning_step(self, batch: dict):
        """Training entry point."""
        batch = compute_advantages(batch, self.args)
        new_logps = self.model.compute_logps(batch["input_ids"], batch["attention_mask"])
        loss = pg_kl_loss(new_logps, batch, self.args)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        return {"loss": loss.item(), **summarize(batch)}
