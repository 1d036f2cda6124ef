# Reviewer: ROLL-style actor worker. The in-reward KL estimator is a class looked up by
# name in the module's globals(): globals()[cfg.reward_kl_estimator](), default
# "K3Estimator" (k3 spelled with expm1: expm1(-logr) + logr). compute_token_rewards runs
# under @torch.no_grad(), puts -kl_coef * k3 into the per-token rewards, adds the score
# on the last token and turns them into returns (gamma = 1 backward loop); the loss
# weights log-probs by these returns. A detached k3 as a reward has expected gradient
# grad KL(pi||pi_ref) minus the token-level partial of KL(pi_ref||pi): biased.
# Verdict: bug, KL004, reported inside compute_token_rewards on the
# `kl = self.kl_estimator(...)` line (the helper makes the rewards itself; the estimator
# comes from the config, not from a literal at the call).
from dataclasses import dataclass

import torch

from roll.distributed.scheduler.protocol import DataProto
from roll.pipeline.rlvr.rlvr_config import RLVRConfig


class K1Estimator:
    def __call__(self, log_probs, ref_log_probs):
        return log_probs - ref_log_probs


class K2Estimator:
    def __call__(self, log_probs, ref_log_probs):
        return 0.5 * (log_probs - ref_log_probs).square()


class K3Estimator:
    def __call__(self, log_probs, ref_log_probs):
        log_ratio = log_probs - ref_log_probs
        return torch.expm1(-log_ratio) + log_ratio


@dataclass
class PPOWorkerConfig:
    reward_kl_estimator: str = "K3Estimator"
    kl_coef: float = 0.05
    gamma: float = 1.0


class ActorWorker:
    def __init__(self, cfg: PPOWorkerConfig = PPOWorkerConfig()):
        self.cfg = cfg
        estimator_cls = globals().get(cfg.reward_kl_estimator)
        if estimator_cls is None:
            raise ValueError(f"unknown KL estimator {cfg.reward_kl_estimator}")
        self.kl_estimator = estimator_cls()

    @torch.no_grad()
    def compute_token_rewards(self, scores, log_probs, ref_log_probs, response_mask):
        # error: KL004
        kl = self.kl_estimator(log_probs, ref_log_probs)
        token_rewards = -self.cfg.kl_coef * kl * response_mask
        last = response_mask.sum(-1).long() - 1
        token_rewards[torch.arange(token_rewards.size(0)), last] += scores
        returns = torch.zeros_like(token_rewards)
        running = torch.zeros_like(scores)
        for t in reversed(range(token_rewards.size(1))):
            running = token_rewards[:, t] + self.cfg.gamma * running
            returns[:, t] = running
        return returns * response_mask

    def loss_func(self, log_probs, returns, response_mask):
        return -(returns * log_probs * response_mask).sum(-1).mean()

    def train_step(self, data: DataProto, model, optimizer):
        batch = data.batch
        returns = self.compute_token_rewards(
            batch["scores"], batch["old_log_probs"], batch["ref_log_probs"], batch["response_mask"]
        )
        log_probs = model.compute_log_probs(batch["input_ids"], batch["attention_mask"], batch["responses"])
        loss = self.loss_func(log_probs, returns, batch["response_mask"])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return {"actor/loss": loss.item(), "actor/return": returns[:, 0].mean().item()}
