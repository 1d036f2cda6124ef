"""ReMax (REINFORCE with a greedy baseline) with a KL penalty bound via functools.partial."""
import functools
from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class ReMaxArgs:
    kl_coef: float = 0.05
    kl_estimator: str = "k1"
    max_new_tokens: int = 128
    grad_accum: int = 2


def approx_kl(logp: torch.Tensor, ref_logp: torch.Tensor, mask: Optional[torch.Tensor] = None, estimator: str = "k3") -> torch.Tensor:
    log_ratio = logp - ref_logp
    if estimator == "k1":
        # ok: KL001
        kl = log_ratio
    elif estimator == "k2":
        kl = 0.5 * log_ratio.pow(2)
    elif estimator == "k3":
        kl = torch.expm1(-log_ratio) + log_ratio
    else:
        raise ValueError(f"unknown estimator {estimator}")
    if mask is not None:
        kl = kl * mask
    return kl


def sequence_logprobs(model, input_ids: torch.Tensor, gen_len: int) -> torch.Tensor:
    logits = model(input_ids).logits[:, -gen_len - 1 : -1].float()
    logp_all = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    return logp_all.gather(-1, input_ids[:, -gen_len:].unsqueeze(-1)).squeeze(-1)


class ReMaxTrainer:
    def __init__(self, policy, ref_policy, reward_model, args: ReMaxArgs = ReMaxArgs()):
        self.policy = policy
        self.ref_policy = ref_policy
        self.reward_model = reward_model
        self.args = args
        self.kl_fn = functools.partial(approx_kl, estimator=args.kl_estimator)

    def loss(self, sampled_ids: torch.Tensor, greedy_ids: torch.Tensor, gen_mask: torch.Tensor) -> torch.Tensor:
        gen_len = gen_mask.shape[1]
        with torch.no_grad():
            baseline = self.reward_model(greedy_ids)
            reward = self.reward_model(sampled_ids)
            ref_lp = sequence_logprobs(self.ref_policy, sampled_ids, gen_len)
        logp_new = sequence_logprobs(self.policy, sampled_ids, gen_len)

        pg_loss = -((reward - baseline) * (logp_new * gen_mask).sum(-1)).mean()
        # error: KL001
        kl = self.kl_fn(logp_new, ref_lp, mask=gen_mask)
        kl_loss = kl.sum(-1).mean()
        return pg_loss + self.args.kl_coef * kl_loss

    def train_step(self, optimizer, micro_batches) -> float:
        total = 0.0
        for sampled_ids, greedy_ids, gen_mask in micro_batches:
            loss = self.loss(sampled_ids, greedy_ids, gen_mask) / self.args.grad_accum
            loss.backward()
            total += loss.item()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return total
