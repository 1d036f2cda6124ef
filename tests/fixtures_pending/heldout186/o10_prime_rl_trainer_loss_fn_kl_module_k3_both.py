# Reviewer: prime-rl-style trainer handed the same GRPOLoss(beta, kl=KLLoss("k3"))
# object as e10, with TrainerConfig.kl_in_reward=True by default: GRPOLoss runs
# BOTH halves of k3 with the same beta. Under no_grad it adds the per-token
# returns (reverse cumsum) of the KL reward -beta * k3 to the advantages, and it
# keeps beta * k3 as a per-token loss with gradient. The reward half has expected
# gradient beta * (grad KL(pi||pi_ref) - token-level grad KL(pi_ref||pi)), the
# loss half beta * (token-level grad KL(pi_ref||pi)); their sum is
# beta * grad KL(pi||pi_ref) of the sequence (the "both" pairing).
# Verdict: correct. The k3 reward line and the k3 loss call stay silent.
from dataclasses import dataclass

import torch
import torch.nn as nn

from prime_rl.trainer.model import get_model, forward
from prime_rl.trainer.data import DataLoader


@dataclass
class TrainerConfig:
    beta: float = 0.04
    kl_estimator: str = "k3"
    clip_eps: float = 0.2
    max_tokens: int = 1024
    kl_in_reward: bool = True


class KLLoss(nn.Module):
    def __init__(self, estimator: str = "k3"):
        super().__init__()
        self.estimator = estimator

    def forward(self, logprobs, ref_logprobs):
        if self.estimator == "k3":
            ratio = torch.exp(ref_logprobs - logprobs)
            return ratio - torch.log(ratio) - 1
        if self.estimator == "k2":
            return 0.5 * (logprobs - ref_logprobs) ** 2
        raise ValueError(f"unknown KL estimator {self.estimator}")


class GRPOLoss(nn.Module):
    def __init__(self, beta: float, kl: KLLoss, clip_eps: float = 0.2, max_tokens: int = 1024, kl_in_reward: bool = True):
        super().__init__()
        self.kl_in_reward = kl_in_reward
        self.beta = beta
        self.kl = kl
        self.clip_eps = clip_eps
        self.max_tokens = max_tokens

    def forward(self, logprobs, old_logprobs, ref_logprobs, advantages, loss_mask):
        ratio = torch.exp(logprobs - old_logprobs)
        adv = advantages.unsqueeze(-1)
        if self.kl_in_reward:
            with torch.no_grad():
                # ok: KL004
                kl_reward = -self.beta * self.kl(old_logprobs, ref_logprobs) * loss_mask
                adv = adv + kl_reward.flip(-1).cumsum(-1).flip(-1)
        pg = -torch.min(ratio * adv, ratio.clamp(1 - self.clip_eps, 1 + self.clip_eps) * adv)
        # ok: KL002
        per_token_kl = self.kl(logprobs, ref_logprobs)
        per_token_loss = pg + self.beta * per_token_kl
        return (per_token_loss * loss_mask).sum() / (loss_mask.size(0) * self.max_tokens)


class Trainer:
    def __init__(self, model, ref_model, optimizer, loss_fn: nn.Module):
        self.model = model
        self.ref_model = ref_model
        self.optimizer = optimizer
        self.loss_fn = loss_fn

    def _logprobs(self, model, batch):
        logits = forward(model, batch["input_ids"], batch["position_ids"])[:, :-1]
        return torch.gather(logits.log_softmax(-1), 2, batch["input_ids"][:, 1:].unsqueeze(-1)).squeeze(-1)

    def step(self, micro_batches):
        for mb in micro_batches:
            logprobs = self._logprobs(self.model, mb)
            with torch.no_grad():
                ref_logprobs = self._logprobs(self.ref_model, mb)
            loss = self.loss_fn(logprobs, mb["old_logprobs"], ref_logprobs, mb["advantages"], mb["loss_mask"])
            loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()


def main(config: TrainerConfig = TrainerConfig()):
    model, ref_model = get_model(), get_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    loss_fn = GRPOLoss(config.beta, KLLoss(config.kl_estimator), config.clip_eps, config.max_tokens, config.kl_in_reward)
    trainer = Trainer(model, ref_model, optimizer, loss_fn=loss_fn)
    for micro_batches in DataLoader():
        trainer.step(micro_batches)
