# Reviewer: open-instruct-style PPO with the same int selector
# `kl_estimator: Literal[0, 1, 2, 3] = 2` (k3) and the same stack of four
# estimators, used in BOTH places with the same `beta`: as the per-token
# non-score reward `-beta * kl` (no_grad, credited by reverse-cumsum returns)
# and as a per-token loss `beta * kl` differentiated through the new
# log-probs. `mask_logprobs` zeroes the log-ratio at padded positions.
# Verdict: CORRECT. Each half alone is wrong (the reward gives
# grad KL(pi||pi_ref) - partial grad KL(pi_ref||pi); the loss gives
# partial grad KL(pi_ref||pi)), but the halves cancel: the sum is
# grad KL(pi||pi_ref). Both run whenever beta > 0.
from dataclasses import dataclass
from typing import Literal

import torch
from open_instruct.model_utils import get_reward

INVALID_LOGPROB = 1.0


@dataclass
class Args:
    beta: float = 0.05
    kl_estimator: Literal[0, 1, 2, 3] = 2
    cliprange: float = 0.2
    response_length: int = 512
    num_mini_batches: int = 1


def mask_logprobs(logprobs: torch.Tensor, padding_mask: torch.Tensor) -> torch.Tensor:
    return torch.masked_fill(logprobs, padding_mask, INVALID_LOGPROB)


def stacked_kl(logprobs, ref_logprobs):
    logr = logprobs - ref_logprobs
    kl1 = logr
    kl2 = 0.5 * logr**2
    # ok: KL002
    kl3 = torch.expm1(-logr) + logr
    kl4 = (logr.exp() - 1) - logr
    return torch.stack([kl1, kl2, kl3, kl4])


class PPOTrainer:
    def __init__(self, args: Args, policy, ref_policy, reward_model, optimizer):
        self.args, self.policy, self.ref_policy = args, policy, ref_policy
        self.reward_model, self.optimizer = reward_model, optimizer

    @torch.no_grad()
    def compute_returns(self, logprobs, ref_logprobs, scores, padding_mask):
        # ok: KL004
        kl_4BT = stacked_kl(mask_logprobs(logprobs, padding_mask), mask_logprobs(ref_logprobs, padding_mask))
        rewards = -self.args.beta * kl_4BT[self.args.kl_estimator]
        seq_lens = (~padding_mask).sum(-1) - 1
        rewards[torch.arange(rewards.size(0)), seq_lens] += scores
        returns = torch.masked_fill(rewards.flip(-1).cumsum(-1).flip(-1), padding_mask, 0.0)
        return returns, {f"objective/kl{i + 1}": kl_4BT[i].sum(1).mean().item() for i in range(4)}

    def loss(self, new_logprobs, old_logprobs, ref_logprobs, returns, padding_mask):
        new_logprobs = mask_logprobs(new_logprobs, padding_mask)
        ratio = torch.exp(new_logprobs - old_logprobs)
        pg_losses = -returns * ratio
        pg_losses2 = -returns * torch.clamp(ratio, 1.0 - self.args.cliprange, 1.0 + self.args.cliprange)
        pg_loss_max = torch.max(pg_losses, pg_losses2)
        # ok: KL002
        kl = stacked_kl(new_logprobs, mask_logprobs(ref_logprobs, padding_mask))[self.args.kl_estimator]
        return ((pg_loss_max + self.args.beta * kl) * (~padding_mask)).sum(1).mean()

    def train_step(self, queries, responses, padding_mask):
        def forward_logprobs(model):
            logits = model(torch.cat([queries, responses], 1)).logits[:, queries.size(1) - 1 : -1]
            return torch.gather(logits.log_softmax(-1), 2, responses.unsqueeze(-1)).squeeze(-1)

        with torch.no_grad():
            logprobs = forward_logprobs(self.policy)
            ref_logprobs = forward_logprobs(self.ref_policy)
            _, scores, _ = get_reward(self.reward_model, torch.cat([queries, responses], 1))
        returns, metrics = self.compute_returns(logprobs, ref_logprobs, scores, padding_mask)
        old_logprobs = mask_logprobs(logprobs, padding_mask)
        for mb in torch.arange(queries.size(0)).chunk(self.args.num_mini_batches):
            new_logprobs = forward_logprobs(self.policy)[mb]
            loss = self.loss(new_logprobs, old_logprobs[mb], ref_logprobs[mb], returns[mb], padding_mask[mb])
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
        return metrics
