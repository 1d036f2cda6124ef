# Reviewer: oat-style online RL learner. `PolicyHead.forward` returns a
# `PolicyOutputs` dataclass with the raw `logits`, the full-vocabulary
# `log_probs` (log_softmax, [B, T, V]) and the sampled tokens' `token_log_probs`.
# The reference is another `PolicyHead` run under torch.no_grad(). The KL term
# is the EXACT KL(pi||pi_ref) of each position over the vocabulary,
# sum_v p_v (log p_v - log q_v), summed over the positions of the policy's own
# sampled response and added to the loss: each position's conditional is pulled
# toward the reference, but the effect of a token on the later positions is
# lost. Expected gradient: the token-level partial of grad KL(pi||pi_ref).
# Verdict: bug, KL003, reported on the `per_pos_kl = ...` line of learning_step.
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from oat.types import TrajectoryData


@dataclass
class PolicyOutputs:
    logits: torch.Tensor
    log_probs: torch.Tensor
    token_log_probs: torch.Tensor


class PolicyHead(nn.Module):
    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids, attention_mask, response_len) -> PolicyOutputs:
        logits = self.lm(input_ids=input_ids, attention_mask=attention_mask).logits[:, -response_len - 1 : -1]
        log_probs = F.log_softmax(logits.float(), dim=-1)
        token_lp = log_probs.gather(-1, input_ids[:, -response_len:].unsqueeze(-1)).squeeze(-1)
        return PolicyOutputs(logits=logits, log_probs=log_probs, token_log_probs=token_lp)


class PolicyGradientLearner:
    def __init__(self, policy: PolicyHead, ref: PolicyHead, beta=0.05, clip=0.2):
        self.policy = policy
        self.ref = ref
        self.beta = beta
        self.clip = clip

    def learning_step(self, traj):
        mask = traj["response_mask"]
        n = mask.shape[1]
        out = self.policy(traj["input_ids"], traj["attention_mask"], n)
        with torch.no_grad():
            ref_out = self.ref(traj["input_ids"], traj["attention_mask"], n)

        ratio = torch.exp(out.token_log_probs - traj["behavior_logps"])
        adv = traj["advantages"].unsqueeze(-1)
        pg = -torch.min(ratio * adv, ratio.clamp(1 - self.clip, 1 + self.clip) * adv)
        probs = out.log_probs.exp()
        # error: KL003
        per_pos_kl = (probs * (out.log_probs - ref_out.log_probs)).sum(-1)
        loss = ((pg + self.beta * per_pos_kl) * mask).sum(-1).mean()
        info = {"kl": (per_pos_kl.detach() * mask).sum(-1).mean().item(), "logit_norm": out.logits.detach().norm().item()}
        return loss, info

    def train(self, traj: TrajectoryData, optimizer):
        loss, info = self.learning_step(traj)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return info
