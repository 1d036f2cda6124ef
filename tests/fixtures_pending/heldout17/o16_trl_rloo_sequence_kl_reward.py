"""TRL RLOOTrainer-style update: the KL is a sequence-level reward.

The per-token log-ratio of the rollout is summed over the response, scaled by
``-kl_coef`` and added to the score; the leave-one-out baseline is subtracted
and the advantage weights the whole response's log-prob through a
sequence-level importance ratio.
"""

from dataclasses import dataclass
from typing import Dict

import torch


@dataclass
class RLOOConfig:
    rloo_k: int = 2
    kl_coef: float = 0.05
    cliprange: float = 0.2
    temperature: float = 0.7
    num_ppo_epochs: int = 1
    local_mini_batch_size: int = 8


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return torch.gather(logits.log_softmax(-1), dim=-1, index=index.unsqueeze(-1)).squeeze(-1)


@torch.no_grad()
def compute_rloo_advantages(
    scores: torch.Tensor, logprobs: torch.Tensor, ref_logprobs: torch.Tensor, response_mask: torch.Tensor, args: RLOOConfig
) -> Dict[str, torch.Tensor]:
    # ok: KL003, KL004, KL005, KL006
    kl = (logprobs - ref_logprobs) * response_mask
    non_score_reward = (-args.kl_coef * kl).sum(1)
    rlhf_reward = scores + non_score_reward
    rlhf_reward = rlhf_reward.reshape(args.rloo_k, -1)
    baseline = (rlhf_reward.sum(0) - rlhf_reward) / (args.rloo_k - 1)
    advantages = (rlhf_reward - baseline).flatten()
    return {"advantages": advantages, "rlhf_reward": rlhf_reward.flatten(), "non_score_reward": non_score_reward}


def rloo_policy_loss(
    new_logprobs: torch.Tensor, mb_logprobs: torch.Tensor, mb_advantage: torch.Tensor, response_mask: torch.Tensor, args: RLOOConfig
) -> torch.Tensor:
    new_seq_logprobs = (new_logprobs * response_mask).sum(1)
    old_seq_logprobs = (mb_logprobs * response_mask).sum(1)
    new_ratio = (new_seq_logprobs - old_seq_logprobs).exp()
    pg_losses = -mb_advantage * new_ratio
    pg_losses2 = -mb_advantage * torch.clamp(new_ratio, 1.0 - args.cliprange, 1.0 + args.cliprange)
    return torch.max(pg_losses, pg_losses2).mean()


class RLOOTrainer:
    def __init__(self, policy, ref_policy, optimizer, accelerator, args: RLOOConfig = RLOOConfig()):
        self.policy = policy
        self.ref_policy = ref_policy
        self.optimizer = optimizer
        self.accelerator = accelerator
        self.args = args

    def _logprobs(self, model, query_responses: torch.Tensor, context_length: int) -> torch.Tensor:
        logits = model(query_responses).logits[:, context_length - 1 : -1] / (self.args.temperature + 1e-7)
        return selective_log_softmax(logits, query_responses[:, context_length:])

    def train_step(self, batch: Dict[str, torch.Tensor]) -> float:
        query_responses = batch["query_responses"]
        context_length = batch["context_length"]
        response_mask = batch["response_mask"]
        with torch.no_grad():
            logprobs = self._logprobs(self.policy, query_responses, context_length)
            ref_logprobs = self._logprobs(self.ref_policy, query_responses, context_length)
        adv = compute_rloo_advantages(batch["scores"], logprobs, ref_logprobs, response_mask, self.args)
        total = 0.0
        n = query_responses.size(0)
        for _ in range(self.args.num_ppo_epochs):
            for start in range(0, n, self.args.local_mini_batch_size):
                sl = slice(start, start + self.args.local_mini_batch_size)
                with self.accelerator.accumulate(self.policy):
                    new_logprobs = self._logprobs(self.policy, query_responses[sl], context_length)
                    loss = rloo_policy_loss(new_logprobs, logprobs[sl], adv["advantages"][sl], response_mask[sl], self.args)
                    self.accelerator.backward(loss)
                    self.optimizer.step()
                    self.optimizer.zero_grad()
                total += loss.item()
        return total
