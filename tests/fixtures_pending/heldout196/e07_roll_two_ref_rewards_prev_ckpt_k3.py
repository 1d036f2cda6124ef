# Reviewer: ROLL-style pipeline with two KL rewards, each with its own
# coefficient: one to the SFT reference and one to the previous checkpoint
# (refreshed every prev_ckpt_interval steps). Both are computed under no_grad in
# compute_token_level_rewards, subtracted from the per-token rewards and turned
# into returns (gamma = 1) that weight the policy's log-probs. The SFT KL reward
# is the log-ratio (k1): correct. The previous-checkpoint reward is written as
# k3, exp(prev - logp) - (prev - logp) - 1: as a reward it contributes
# grad KL(pi||pi_prev) minus the token-level partial gradient of
# KL(pi_prev||pi), a biased penalty that nearly vanishes near that checkpoint.
# Verdict: bug, KL004, reported on the k3 line inside compute_token_level_rewards.
from dataclasses import dataclass

import torch

from roll.distributed.scheduler.protocol import DataProto
from roll.pipeline.base_worker import ActorWorker


@dataclass
class TwoRefKLConfig:
    sft_kl_coef: float = 0.02
    prev_kl_coef: float = 0.08
    prev_ckpt_interval: int = 50
    gamma: float = 1.0


class TwoRefRewardActor(ActorWorker):
    def __init__(self, config: TwoRefKLConfig, policy=None, prev_policy=None):
        self.config = config
        self.policy = policy
        self.prev_policy = prev_policy
        self.step = 0

    def refresh_prev_checkpoint(self):
        if self.step % self.config.prev_ckpt_interval == 0:
            self.prev_policy.load_state_dict(self.policy.state_dict())

    @torch.no_grad()
    def compute_token_level_rewards(self, old_log_probs, ref_log_probs, prev_log_probs, scores, response_mask):
        cfg = self.config
        # ok: KL005
        sft_kl = old_log_probs - ref_log_probs
        prev_log_ratio = prev_log_probs - old_log_probs
        # error: KL004
        prev_kl = torch.exp(prev_log_ratio) - prev_log_ratio - 1
        token_rewards = -(cfg.sft_kl_coef * sft_kl + cfg.prev_kl_coef * prev_kl) * response_mask
        last = response_mask.sum(-1).long() - 1
        token_rewards[torch.arange(token_rewards.shape[0]), last] += scores
        return token_rewards

    @torch.no_grad()
    def compute_returns(self, token_rewards, response_mask):
        returns = torch.zeros_like(token_rewards)
        running = torch.zeros(token_rewards.shape[0], dtype=token_rewards.dtype)
        for t in reversed(range(token_rewards.shape[1])):
            running = token_rewards[:, t] + self.config.gamma * running * response_mask[:, t]
            returns[:, t] = running
        return returns * response_mask

    def policy_loss(self, log_probs, returns, response_mask):
        return -(returns * log_probs * response_mask).sum(-1).mean()

    def train_step(self, data: DataProto):
        self.refresh_prev_checkpoint()
        b = data.batch
        rewards = self.compute_token_level_rewards(
            b["old_log_probs"], b["ref_log_probs"], b["prev_log_probs"], b["scores"], b["response_mask"]
        )
        returns = self.compute_returns(rewards, b["response_mask"])
        log_probs = self.policy.compute_log_probs(b["input_ids"], b["attention_mask"], b["responses"])
        loss = self.policy_loss(log_probs, returns, b["response_mask"])
        loss.backward()
        self.step += 1
        return {"loss": loss.item(), "reward_mean": rewards.sum(-1).mean().item()}
