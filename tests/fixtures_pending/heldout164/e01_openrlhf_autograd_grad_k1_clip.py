# Reviewer: OpenRLHF-style PPO actor step with the gradient composed by hand.
# The clipped policy-gradient loss is backpropagated first (retain_graph=True);
# the KL loss is then differentiated on its own with torch.autograd.grad, its
# gradient clipped separately and added into p.grad before optimizer.step().
# The KL is compute_approx_kl with the args default kl_estimator="k1": the
# log-ratio itself, with its gradient. grad k1 = grad logp, whose expectation
# under y ~ pi is zero; the separate clipping and the add into p.grad only
# rescale that zero-mean noise.
# Verdict: bug, KL001, reported where the loss calls compute_approx_kl.
from dataclasses import dataclass

import torch

from openrlhf.models.utils import masked_mean  # noqa: F401  (not used on this path)
from openrlhf.utils.deepspeed import DeepspeedStrategy  # noqa: F401


def compute_approx_kl(log_probs, log_probs_base, kl_estimator: str = "k1"):
    # ok: KL001
    log_ratio = log_probs - log_probs_base
    if kl_estimator == "k2":
        log_ratio = log_ratio**2 / 2.0
    elif kl_estimator == "k3":
        log_ratio = -log_ratio
        log_ratio = log_ratio.exp() - 1 - log_ratio
    return log_ratio.clamp(min=-10, max=10)


@dataclass
class ActorArgs:
    init_kl_coef: float = 0.01
    kl_estimator: str = "k1"
    eps_clip: float = 0.2
    kl_max_grad_norm: float = 1.0
    max_norm: float = 1.0
    generate_max_len: int = 8


class ActorPPOTrainer:
    def __init__(self, actor, optimizer, args=None):
        self.actor = actor
        self.optimizer = optimizer
        self.args = args or ActorArgs()

    def action_log_probs(self, sequences, attention_mask, num_actions):
        logits = self.actor(sequences, attention_mask=attention_mask).logits
        logits = logits[:, -num_actions - 1 : -1]
        log_probs = torch.log_softmax(logits, dim=-1)
        return log_probs.gather(-1, sequences[:, -num_actions:].unsqueeze(-1)).squeeze(-1)

    def policy_loss(self, log_probs, old_log_probs, advantages, action_mask):
        ratio = (log_probs - old_log_probs).exp()
        surr1 = ratio * advantages
        surr2 = ratio.clamp(1 - self.args.eps_clip, 1 + self.args.eps_clip) * advantages
        loss = -torch.min(surr1, surr2)
        return (loss * action_mask).sum(-1).mean() / self.args.generate_max_len

    def training_step(self, experience):
        args = self.args
        params = [p for p in self.actor.parameters() if p.requires_grad]
        action_mask = experience["action_mask"]
        num_actions = action_mask.shape[1]
        log_probs = self.action_log_probs(experience["sequences"], experience["attention_mask"], num_actions)

        pg_loss = self.policy_loss(log_probs, experience["action_log_probs"], experience["advantages"], action_mask)
        self.optimizer.zero_grad()
        pg_loss.backward(retain_graph=True)

        # KL regulariser: own gradient, own clipping, then folded into p.grad
        # error: KL001
        kl = compute_approx_kl(log_probs, experience["base_action_log_probs"], kl_estimator=args.kl_estimator)
        kl_loss = (kl * action_mask).sum(-1).mean() / args.generate_max_len
        kl_grads = torch.autograd.grad(kl_loss, params, allow_unused=True)

        kl_norm = torch.sqrt(sum((g**2).sum() for g in kl_grads if g is not None))
        scale = float((args.kl_max_grad_norm / (args.init_kl_coef * kl_norm + 1e-6)).clamp(max=1.0))
        for p, g in zip(params, kl_grads):
            if g is None:
                continue
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            p.grad.add_(g, alpha=args.init_kl_coef * scale)

        grad_norm = torch.nn.utils.clip_grad_norm_(params, args.max_norm)
        self.optimizer.step()
        return {
            "policy_loss": pg_loss.item(),
            "kl": kl_loss.item(),
            "kl_grad_scale": scale,
            "grad_norm": float(grad_norm),
        }
