# Reviewer: prime-rl-style REINFORCE trainer with a KL reward. kl_rewards (under
# no_grad) turns the rollout log-ratio into per-token rewards -kl_coef * logr_t,
# and discounted_returns credits them with a backward loop using the class
# attribute `gamma`. The base class has gamma = 1.0 (a reward-to-go: correct).
# The trainer that runs, ProcessRewardTrainer (picked by TRAINERS[cfg.algo] with
# the default algo "prm"), overrides `gamma = 0.0` because its process rewards are
# dense. With gamma = 0 each token's advantage is its own reward only, so the KL
# reward weights only its own token's log-prob: the token-level (partial)
# gradient of the sequence KL(pi||pi_ref).
# Verdict: bug, KL003, reported inside kl_rewards on the line that computes the log-ratio.
from dataclasses import dataclass

import torch

from prime_rl.trainer.model import get_logprobs


@dataclass
class TrainerConfig:
    algo: str = "prm"
    kl_coef: float = 0.02


class ReinforceTrainer:
    gamma = 1.0

    def __init__(self, config: TrainerConfig):
        self.config = config

    def kl_rewards(self, logprobs, ref_logprobs, loss_mask):
        with torch.no_grad():
            # error: KL003
            kl = logprobs - ref_logprobs
            return -self.config.kl_coef * kl * loss_mask

    def discounted_returns(self, rewards, loss_mask):
        returns = torch.zeros_like(rewards)
        running = torch.zeros_like(rewards[:, 0])
        for t in reversed(range(rewards.shape[1])):
            running = rewards[:, t] + self.gamma * running
            returns[:, t] = running
        return returns * loss_mask

    def step_rewards(self, batch):
        rewards = torch.zeros_like(batch["logprobs"])
        last = batch["loss_mask"].sum(-1).long() - 1
        rewards[torch.arange(rewards.shape[0]), last] = batch["scores"]
        return rewards

    def compute_advantages(self, batch):
        loss_mask = batch["loss_mask"]
        rewards = self.step_rewards(batch) + self.kl_rewards(batch["logprobs"], batch["ref_logprobs"], loss_mask)
        return self.discounted_returns(rewards, loss_mask)

    def compute_loss(self, logprobs, batch, advantages):
        loss_mask = batch["loss_mask"]
        ratio = torch.exp(logprobs - batch["logprobs"])
        return -(ratio * advantages * loss_mask).sum() / loss_mask.shape[0]


class ProcessRewardTrainer(ReinforceTrainer):
    # dense process rewards: every step already carries its own reward
    gamma = 0.0

    def step_rewards(self, batch):
        return batch["process_rewards"] * batch["loss_mask"]


TRAINERS = {"reinforce": ReinforceTrainer, "prm": ProcessRewardTrainer}


def train_step(trainer, model, batch):
    advantages = trainer.compute_advantages(batch)
    logprobs = get_logprobs(model, batch["input_ids"], batch["position_ids"])
    loss = trainer.compute_loss(logprobs, batch, advantages)
    loss.backward()
    return loss.detach()


if __name__ == "__main__":
    cfg = TrainerConfig()
    trainer = TRAINERS[cfg.algo](cfg)
    print(type(trainer).__name__, trainer.gamma)
