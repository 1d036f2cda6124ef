# Reviewer: prime-rl-style REINFORCE trainer on variable-length samples kept as
# lists of 1-D tensors. `compute_token_advantages` (under torch.no_grad()) puts
# a per-token KL reward -kl_coef * (logp_t - ref_t) (k1, correct as a reward) into
# each sample's token rewards and adds the outcome score, broadcast to every
# token. The score is thus credited to all tokens (its reward-to-go), but each KL
# reward only to its OWN token: no reward-to-go for the KL. The loss weights
# logp_t by these advantages, so the KL part of the gradient is
# kl_coef * E[sum_t logr_t grad logp_t], the token-level partial gradient.
# Verdict: bug, KL003, reported inside compute_token_advantages on the line that
# computes the KL reward (the estimate), `token_rewards = -self.kl_coef * (...)`.
from typing import Dict, List

import torch

from prime_rl.trainer.config import LossConfig
from prime_rl.trainer.model import get_logprobs


class ListReinforceTrainer:
    def __init__(self, model=None, optimizer=None, kl_coef: float = 0.02, mask_ratio_high: float = 8.0):
        self.model = model
        self.optimizer = optimizer
        self.kl_coef = kl_coef
        self.mask_ratio_high = mask_ratio_high

    @torch.no_grad()
    def compute_token_advantages(
        self,
        scores: List[float],
        logprobs: List[torch.Tensor],
        ref_logprobs: List[torch.Tensor],
    ) -> List[torch.Tensor]:
        advantages = []
        for score, lp_i, ref_i in zip(scores, logprobs, ref_logprobs):
            # error: KL003
            token_rewards = -self.kl_coef * (lp_i - ref_i)
            advantages.append(token_rewards + score)
        return advantages

    def loss(
        self,
        logprobs: List[torch.Tensor],
        old_logprobs: List[torch.Tensor],
        advantages: List[torch.Tensor],
    ) -> torch.Tensor:
        per_sample = []
        for lp, old_lp, adv in zip(logprobs, old_logprobs, advantages):
            log_importance = lp - old_lp
            ratio = torch.exp(log_importance)
            is_masked = (ratio > self.mask_ratio_high).detach()
            per_token = -ratio * adv * (~is_masked)
            per_sample.append(per_token.sum())
        return torch.stack(per_sample).mean()

    def step(self, batch: Dict) -> Dict[str, float]:
        logprobs = [get_logprobs(self.model, ids) for ids in batch["sample_ids"]]
        advantages = self.compute_token_advantages(batch["scores"], batch["old_logprobs"], batch["ref_logprobs"])
        loss = self.loss(logprobs, batch["old_logprobs"], advantages)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {"loss": loss.item()}
