import torch

from .kl_utils import policy_logprobs
from .losses import CumulativeKLLoss


class Trainer:
    def __init__(self, strategy, actor, ref, optim, beta=0.02):
        self.strategy = strategy
        self.actor = actor
        self.ref = ref
        self.optim = optim
        self.kl_loss = CumulativeKLLoss(beta)

    def step(self, ids, mask, adv):
        n = mask.size(1)
        logp = policy_logprobs(self.actor, ids, n)
        with torch.no_grad():
            ref_logp = policy_logprobs(self.ref, ids, n)
        pg = -(adv[:, None] * logp * mask).sum(-1).mean()
        loss = pg + self.kl_loss(logp, ref_logp, mask)
        self.strategy.backward(loss, self.actor, self.optim)
        self.strategy.optimizer_step(self.optim, self.actor)
