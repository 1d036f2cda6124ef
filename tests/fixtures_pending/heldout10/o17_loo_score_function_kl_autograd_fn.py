"""RLOO-style trainer with the score-function KL: the detached per-token log-ratio is
turned into a reward-to-go by a custom `torch.autograd.Function` (a reverse cumsum with no
backward through its input), a leave-one-out baseline over the k samples of the same
prompt is subtracted, and the result weights each token's log-prob.  The baseline comes
from the other, independent samples, so E[sum_t (G_t - b_t) grad logp_t] = grad
KL(pi||pi_ref) of the sequence.  Not a bug, although the log-ratio is detached.
"""
import os

import torch


class _RewardToGo(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.flip(-1).cumsum(-1).flip(-1)

    @staticmethod
    def backward(ctx, grad):
        return None


def reward_to_go(x):
    return _RewardToGo.apply(x)


def leave_one_out(x, k):
    g = x.view(-1, k, *x.shape[1:])
    baseline = (g.sum(1, keepdim=True) - g) / (k - 1)
    return (g - baseline).view_as(x)


class RLOOKLLoss(torch.nn.Module):
    def __init__(self, rloo_k: int = int(os.environ.get("RLOO_K", "4")), beta: float = 0.05):
        super().__init__()
        self.rloo_k = rloo_k
        self.beta = beta

    def forward(self, logp, ref_logp, mask, scores):
        # ok: KL005
        log_ratio = (logp - ref_logp).detach() * mask
        kl_to_go = reward_to_go(log_ratio)
        kl_adv = leave_one_out(kl_to_go, self.rloo_k)
        score_adv = leave_one_out(scores, self.rloo_k)[:, None]
        per_token = -score_adv * logp + self.beta * kl_adv * logp
        return (per_token * mask).sum(-1).mean()


def rloo_step(policy, ref_policy, batch, loss_fn: RLOOKLLoss, optimizer):
    ids = batch["input_ids"]
    logp = policy(ids).logits.log_softmax(-1).gather(-1, ids[..., None]).squeeze(-1)
    with torch.no_grad():
        ref_logp = ref_policy(ids).logits.log_softmax(-1).gather(-1, ids[..., None]).squeeze(-1)
    loss = loss_fn(logp, ref_logp, batch["mask"], batch["scores"])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
