# Reviewer: OpenRLHF-style actor loss, same skeleton as e02: PPOActorLoss.forward
# calls compute_approx_kl(..., kl_estimator=self.kl_estimator). Here the base
# class attribute is the plain "k1" (it would be a bug if the base class were
# used), and the subclass REINFORCEPlusPlusLoss overrides it with "k1_to_go":
# value sg(log_ratio), gradient sum_t G_t grad logp_t with G_t the masked
# reward-to-go of the detached log-ratio. The registry default
# --advantage_estimator reinforce++ selects that subclass, so the KL loss has
# the gradient of the sequence KL(pi||pi_ref).
# Verdict: correct. The compute_approx_kl call and the unselected k1/k3 branches stay silent.
import argparse

import torch
import torch.nn as nn

from openrlhf.models.actor import Actor


def compute_approx_kl(log_probs, log_probs_base, action_mask=None, kl_estimator="k1"):
    log_ratio = log_probs.float() - log_probs_base.float()
    if kl_estimator == "k1":
        # ok: KL001
        return log_ratio
    if kl_estimator == "k2":
        return log_ratio**2 / 2.0
    if kl_estimator == "k3":
        log_ratio = -log_ratio
        # ok: KL002
        return log_ratio.exp() - 1 - log_ratio
    if kl_estimator == "k1_to_go":
        detached = log_ratio.detach()
        if action_mask is not None:
            detached = detached * action_mask
        kl_to_go = detached.flip(-1).cumsum(-1).flip(-1)
        return detached + kl_to_go * (log_probs - log_probs.detach())
    raise ValueError(f"unknown kl_estimator {kl_estimator}")


class PPOActorLoss(nn.Module):
    kl_estimator = "k1"

    def __init__(self, kl_coef: float = 0.01, clip_eps: float = 0.2):
        super().__init__()
        self.kl_coef = kl_coef
        self.clip_eps = clip_eps

    def forward(self, log_probs, old_log_probs, base_log_probs, advantages, action_mask):
        ratio = (log_probs - old_log_probs).exp()
        surr1 = ratio * advantages
        surr2 = ratio.clamp(1 - self.clip_eps, 1 + self.clip_eps) * advantages
        pg_loss = (-torch.min(surr1, surr2) * action_mask).sum(-1).mean()
        # ok: KL001
        kl = compute_approx_kl(log_probs, base_log_probs, action_mask=action_mask, kl_estimator=self.kl_estimator)
        kl_loss = (kl * action_mask).sum(-1).mean()
        self.last_kl = (kl.detach() * action_mask).sum() / action_mask.sum()
        return pg_loss + self.kl_coef * kl_loss


class REINFORCEPlusPlusLoss(PPOActorLoss):
    # k1 value for the logs, reward-to-go gradient for the update
    kl_estimator = "k1_to_go"


class GRPOLoss(PPOActorLoss):
    kl_estimator = "k3"


LOSS_REGISTRY = {"gae": PPOActorLoss, "reinforce++": REINFORCEPlusPlusLoss, "group_norm": GRPOLoss}


def build_actor_loss(args):
    loss_cls = LOSS_REGISTRY[args.advantage_estimator]
    return loss_cls(kl_coef=args.init_kl_coef, clip_eps=args.eps_clip)


def parse_args(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--advantage_estimator", type=str, default="reinforce++", choices=list(LOSS_REGISTRY))
    parser.add_argument("--init_kl_coef", type=float, default=0.01)
    parser.add_argument("--eps_clip", type=float, default=0.2)
    return parser.parse_args(argv)


if __name__ == "__main__":
    actor_loss_fn = build_actor_loss(parse_args())
    print(type(actor_loss_fn).__name__, actor_loss_fn.kl_estimator)
