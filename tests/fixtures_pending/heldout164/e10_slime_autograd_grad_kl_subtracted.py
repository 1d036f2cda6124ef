# Reviewer: slime-style actor step with the KL gradient kept apart. The
# policy loss is backpropagated with retain_graph=True; the KL loss, k2 of
# the sequence log-ratio (the right estimator), is differentiated with
# torch.autograd.grad, clipped on its own, and folded into p.grad with
# alpha = -kl_loss_coef ("a descent step follows -grad, so subtract to pull
# back"). p.grad is the gradient of a minimised loss, so the parameters
# receive -kl_loss_coef * grad KL(pi||pi_ref): optimizer.step() increases
# the KL to the reference.
# Verdict: bug, KL006, reported on the line that computes the KL estimate.
from argparse import Namespace

import torch

from slime.backends.megatron_utils.loss import get_log_probs_and_entropy  # noqa: F401  (not used on this path)
from slime.utils.ppo_utils import compute_policy_loss  # noqa: F401

DEFAULT_ARGS = Namespace(
    kl_loss_coef=0.1,
    eps_clip=0.2,
    eps_clip_high=0.28,
    kl_grad_clip=1.0,
    clip_grad=1.0,
    rollout_max_response_len=8,
)


def token_log_probs(model, tokens, n):
    logits = model(input_ids=tokens).logits[:, -n - 1 : -1]
    return torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, -n:, None]).squeeze(-1)


def train_actor_step(model, optimizer, rollout, args=DEFAULT_ARGS):
    params = [p for p in model.parameters() if p.requires_grad]
    loss_masks = rollout["loss_masks"]
    bsz, n = loss_masks.shape
    log_probs = token_log_probs(model, rollout["tokens"], n)

    ppo_kl = rollout["log_probs"] - log_probs
    ratio = torch.exp(-ppo_kl)
    adv = rollout["advantages"]
    pg = -torch.min(ratio * adv, ratio.clamp(1 - args.eps_clip, 1 + args.eps_clip_high) * adv)
    pg_loss = (pg * loss_masks).sum() / (bsz * args.rollout_max_response_len)
    optimizer.zero_grad()
    pg_loss.backward(retain_graph=True)

    seq_log_ratio = ((log_probs - rollout["ref_log_probs"]) * loss_masks).sum(-1)
    # error: KL006
    kl_loss = 0.5 * seq_log_ratio.pow(2).mean()
    kl_grads = torch.autograd.grad(kl_loss, params)
    kl_norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in kl_grads]))
    kl_scale = min(1.0, args.kl_grad_clip / (args.kl_loss_coef * float(kl_norm) + 1e-6))
    # a descent step follows -grad: subtract the KL gradient to pull back to the reference
    for p, g in zip(params, kl_grads):
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        p.grad.add_(g, alpha=-args.kl_loss_coef * kl_scale)

    grad_norm = torch.nn.utils.clip_grad_norm_(params, args.clip_grad)
    optimizer.step()
    return {"pg_loss": pg_loss.item(), "kl_loss": kl_loss.item(), "grad_norm": float(grad_norm)}
