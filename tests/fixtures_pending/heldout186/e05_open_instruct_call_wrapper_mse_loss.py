# Reviewer: open-instruct-style GRPO where the KL regulariser is a plain callable
# object (`__call__`), configured once with its coefficient and reduction, and
# held by an nn.Module policy loss that the learner calls. The default reduction
# is "token": 0.5 * F.mse_loss(new_logprobs, ref_logprobs, reduction="none") is
# per-token k2, summed over each response. Its gradient is right for one token
# given its prefix but, summed over tokens, it is only the token-level partial
# gradient of the sequence KL(pi||pi_ref) (no reward-to-go).
# Verdict: bug, KL003, reported where GRPOPolicyLoss.forward calls the regulariser
# (a helper given log-probs that returns the KL term).
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

from open_instruct.model_utils import log_softmax_and_gather
from open_instruct.utils import ArgumentParserPlus


def get_args(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--beta", type=float, default=0.05)
    p.add_argument("--clip_lower", type=float, default=0.2)
    p.add_argument("--clip_higher", type=float, default=0.28)
    p.add_argument("--kl_reduction", type=str, default="token", choices=["token", "sequence"])
    return p.parse_args(argv)


class KLRegularizer:
    def __init__(self, beta: float, reduction: str = "token"):
        self.beta = beta
        self.reduction = reduction

    def __call__(self, new_logprobs, ref_logprobs, response_mask):
        if self.reduction == "token":
            sq = F.mse_loss(new_logprobs, ref_logprobs, reduction="none")
            return self.beta * (0.5 * sq * response_mask).sum(-1).mean()
        if self.reduction == "sequence":
            seq_new = (new_logprobs * response_mask).sum(-1)
            seq_ref = (ref_logprobs * response_mask).sum(-1)
            return self.beta * 0.5 * F.mse_loss(seq_new, seq_ref, reduction="mean")
        raise ValueError(self.reduction)


class GRPOPolicyLoss(nn.Module):
    def __init__(self, args, kl_regularizer: KLRegularizer):
        super().__init__()
        self.clip_lower = args.clip_lower
        self.clip_higher = args.clip_higher
        self.kl_regularizer = kl_regularizer

    def forward(self, new_logprobs, old_logprobs, ref_logprobs, advantages, response_mask):
        ratio = torch.exp(new_logprobs - old_logprobs)
        pg1 = -advantages[:, None] * ratio
        pg2 = -advantages[:, None] * torch.clamp(ratio, 1.0 - self.clip_lower, 1.0 + self.clip_higher)
        pg_loss = (torch.max(pg1, pg2) * response_mask).sum(-1).mean()
        # error: KL003
        kl_loss = self.kl_regularizer(new_logprobs, ref_logprobs, response_mask)
        return pg_loss + kl_loss, {"pg_loss": pg_loss.detach(), "kl_loss": kl_loss.detach()}


class PolicyTrainer:
    def __init__(self, args, model, ref_model, optimizer):
        self.model = model
        self.ref_model = ref_model
        self.optimizer = optimizer
        self.loss_fn = GRPOPolicyLoss(args, KLRegularizer(args.beta, args.kl_reduction))

    def forward_logprobs(self, model, query_responses, attention_mask, response_length):
        logits = model(input_ids=query_responses, attention_mask=attention_mask).logits
        logits = logits[:, -response_length - 1 : -1]
        return log_softmax_and_gather(logits, query_responses[:, -response_length:])

    def train_step(self, batch):
        T = batch["response_mask"].size(1)
        new_logprobs = self.forward_logprobs(self.model, batch["query_responses"], batch["attention_mask"], T)
        with torch.no_grad():
            ref_logprobs = self.forward_logprobs(self.ref_model, batch["query_responses"], batch["attention_mask"], T)
        loss, stats = self.loss_fn(new_logprobs, batch["old_logprobs"], ref_logprobs, batch["advantages"], batch["response_mask"])
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        return {k: v.item() for k, v in stats.items()}
