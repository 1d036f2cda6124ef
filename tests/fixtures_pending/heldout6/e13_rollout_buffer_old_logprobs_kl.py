"""nn.Module policy loss with a sequence-k2 penalty over an Experience dataclass filled by a no_grad rollout."""
from dataclasses import dataclass

import torch
import torch.nn as nn


@dataclass
class Experience:
    sequences: torch.Tensor
    action_mask: torch.Tensor
    old_log_probs: torch.Tensor
    ref_log_probs: torch.Tensor
    advantages: torch.Tensor


def action_log_probs(model, sequences, num_actions):
    logits = model(sequences).logits[:, -num_actions - 1 : -1]
    return torch.log_softmax(logits, -1).gather(-1, sequences[:, -num_actions:, None]).squeeze(-1)


@torch.no_grad()
def make_experience(actor, ref_actor, sequences, action_mask, advantages):
    n = action_mask.size(1)
    old_log_probs = action_log_probs(actor, sequences, n)
    ref_log_probs = action_log_probs(ref_actor, sequences, n)
    return Experience(sequences, action_mask, old_log_probs, ref_log_probs, advantages)


class KLRegularizedPolicyLoss(nn.Module):
    def __init__(self, clip_eps=0.2, kl_coef=0.02):
        super().__init__()
        self.clip_eps = clip_eps
        self.kl_coef = kl_coef

    def forward(self, log_probs, exp: Experience):
        mask = exp.action_mask
        ratio = (log_probs - exp.old_log_probs).exp()
        adv = exp.advantages.unsqueeze(-1)
        surr = torch.min(ratio * adv, ratio.clamp(1 - self.clip_eps, 1 + self.clip_eps) * adv)
        pg_loss = -(surr * mask).sum(-1).mean()
        # error: KL005
        kl_loss = 0.5 * ((exp.old_log_probs - exp.ref_log_probs) * mask).sum(-1).square().mean()
        return pg_loss + self.kl_coef * kl_loss


def ppo_epoch(actor, loss_fn, optimizer, experiences):
    for exp in experiences:
        log_probs = action_log_probs(actor, exp.sequences, exp.action_mask.size(1))
        loss = loss_fn(log_probs, exp)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
