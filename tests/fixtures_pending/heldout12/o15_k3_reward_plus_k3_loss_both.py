"""REINFORCE with k3 in the reward *and* k3 in the loss, with one coefficient.

Either one alone has a biased gradient; together the score-function part (reward)
and the pathwise part (loss) make d/dtheta E_pi[sum_t k3_t] = grad KL(pi || pi_ref),
because E_pi[exp(-logr_t) | prefix] = 1.
"""
from dataclasses import dataclass
from typing import Dict

import torch


@dataclass
class KLSettings:
    use_kl_in_reward: bool = True
    use_kl_loss: bool = True
    estimator: str = "low_var_kl"
    coef: float = 0.02


def kl_estimate(logprob: torch.Tensor, ref_logprob: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "k1":
        return logprob - ref_logprob
    if kind == "low_var_kl":
        kl = ref_logprob - logprob
        # ok: KL002
        return torch.exp(kl) - kl - 1
    raise ValueError(kind)


def gather_logprobs(model, input_ids: torch.Tensor, response_len: int) -> torch.Tensor:
    logits = model(input_ids).logits[:, -response_len - 1 : -1]
    return torch.log_softmax(logits, -1).gather(-1, input_ids[:, -response_len:, None]).squeeze(-1)


class BothKLTrainer:
    def __init__(self, policy, ref_policy, reward_fn, kl: KLSettings = KLSettings()):
        self.policy, self.ref_policy, self.reward_fn, self.kl = policy, ref_policy, reward_fn, kl
        if kl.use_kl_in_reward != kl.use_kl_loss:
            raise ValueError("k3 must be used in the reward and in the loss together")

    @torch.no_grad()
    def compute_returns(self, input_ids, response_mask) -> Dict[str, torch.Tensor]:
        n = response_mask.shape[1]
        old_logprob = gather_logprobs(self.policy, input_ids, n)
        ref_logprob = gather_logprobs(self.ref_policy, input_ids, n)
        rewards = torch.zeros_like(response_mask)
        rewards[:, -1] = self.reward_fn(input_ids)
        if self.kl.use_kl_in_reward:
            # ok: KL004
            kld = kl_estimate(old_logprob, ref_logprob, self.kl.estimator)
            rewards = rewards - self.kl.coef * kld * response_mask
        returns = torch.flip(torch.cumsum(torch.flip(rewards, [1]), 1), [1])
        return {"old_logprob": old_logprob, "ref_logprob": ref_logprob, "returns": returns}

    def loss(self, input_ids, response_mask, rollout: Dict[str, torch.Tensor]) -> torch.Tensor:
        logprob = gather_logprobs(self.policy, input_ids, response_mask.shape[1])
        ratio = torch.exp(logprob - rollout["old_logprob"])
        per_token_loss = -ratio * rollout["returns"]
        if self.kl.use_kl_loss:
            # ok: KL002
            kld = kl_estimate(logprob, rollout["ref_logprob"], self.kl.estimator)
            per_token_loss = per_token_loss + self.kl.coef * kld
        return (per_token_loss * response_mask).sum(-1).mean()

    def train_step(self, optimizer, input_ids, response_mask) -> float:
        rollout = self.compute_returns(input_ids, response_mask)
        loss = self.loss(input_ids, response_mask, rollout)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.item()
