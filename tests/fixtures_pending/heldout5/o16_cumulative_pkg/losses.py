import torch.nn as nn

from .kl_utils import kl_to_go


class CumulativeKLLoss(nn.Module):
    def __init__(self, beta):
        super().__init__()
        self.beta = beta

    def forward(self, logp, ref_logp, mask):
        # ok: KL001, KL003
        g = kl_to_go(logp, ref_logp, mask)
        return self.beta * (g * logp * mask).sum(-1).mean()
