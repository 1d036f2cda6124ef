# Reviewer: an OpenRLHF-style REINFORCE++ actor step that puts the KL either in
# the loss or in the per-token rewards. The estimate is computed under
# `torch.no_grad() if not args.use_kl_loss else nullcontext()`: with the
# defaults (use_kl_loss=True, kl_estimator="k1") the context is nullcontext(),
# so the k1 log-ratio keeps the policy's gradient and is summed into the loss.
# Its expected gradient is zero: no regularisation. (With use_kl_loss=False the
# same k1 goes to the rewards under no_grad, which would be right.)
# Verdict: bug, KL001, reported where the loss calls compute_approx_kl.
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from openrlhf.models import Actor


@dataclass
class ReinforceArgs:
    init_kl_coef: float = 0.01
    kl_estimator: str = "k1"
    use_kl_loss: bool = True
    eps_clip: float = 0.2


def compute_approx_kl(log_probs, log_probs_base, kl_estimator="k1"):
    if kl_estimator == "k1":
        # ok: KL001
        log_ratio = log_probs - log_probs_base
    elif kl_estimator == "k2":
        log_ratio = (log_probs - log_probs_base) ** 2 / 2.0
    elif kl_estimator == "k3":
        log_ratio = -(log_probs - log_probs_base)
        log_ratio = log_ratio.exp() - 1 - log_ratio
    else:
        raise ValueError(kl_estimator)
    return log_ratio.clamp(min=-10, max=10)


def action_log_probs(model, sequences, attention_mask, num_actions):
    logits = model(input_ids=sequences, attention_mask=attention_mask).logits[:, -num_actions - 1 : -1]
    return torch.gather(logits.log_softmax(-1), -1, sequences[:, -num_actions:].unsqueeze(-1)).squeeze(-1)


class ReinforceActorTrainer:
    def __init__(self, actor: Actor, initial_model, optimizer, args: ReinforceArgs | None = None):
        self.actor = actor
        self.initial_model = initial_model
        self.optimizer = optimizer
        self.args = args or ReinforceArgs()

    def training_step(self, sequences, attention_mask, action_mask, scores):
        args = self.args
        num_actions = action_mask.size(1)
        log_probs = action_log_probs(self.actor, sequences, attention_mask, num_actions)
        with torch.no_grad():
            base_log_probs = action_log_probs(self.initial_model, sequences, attention_mask, num_actions)

        with torch.no_grad() if not args.use_kl_loss else nullcontext():
            # error: KL001
            kl = compute_approx_kl(log_probs, base_log_probs, kl_estimator=args.kl_estimator)

        rewards = torch.zeros_like(log_probs)
        if not args.use_kl_loss:
            rewards = rewards - args.init_kl_coef * kl * action_mask
        last = action_mask.sum(-1).long() - 1
        rewards[torch.arange(rewards.size(0)), last] += scores
        returns = rewards.flip(-1).cumsum(-1).flip(-1)

        ratio = torch.exp(log_probs - log_probs.detach())
        surr = torch.min(ratio * returns, ratio.clamp(1 - args.eps_clip, 1 + args.eps_clip) * returns)
        loss = -(surr * action_mask).sum(-1).mean()
        if args.use_kl_loss:
            kl_loss = (kl * action_mask).sum(-1).mean()
            loss = loss + args.init_kl_coef * kl_loss

        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {"loss": loss.item(), "kl": (kl * action_mask).sum(-1).mean().item()}
