"""Multi-turn agent trainer with per-turn rewards (SkyRL / verl agent-loop style).

An assistant turn is a maximal run of ``loss_mask == 1`` tokens; tool and
environment observations between turns have ``loss_mask == 0``.  Each turn
gets its environment reward and its KL (summed over the turn) at the turn's
last token; REINFORCE++-style returns then credit every token with the rewards
of its own turn and of all later turns.
"""
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class TrainerConfig:
    kl_coef: float = 0.05
    gamma: float = 1.0


def turn_end_mask(loss_mask):
    nxt = torch.cat([loss_mask[:, 1:], torch.zeros_like(loss_mask[:, :1])], dim=1)
    return loss_mask * (1 - nxt)


def sum_per_turn(values, loss_mask):
    """Sum ``values`` over each assistant turn and place the sum at its last token."""
    ends = turn_end_mask(loss_mask)
    out = torch.zeros_like(values)
    running = torch.zeros_like(values[:, 0])
    for t in range(values.shape[1]):
        running = running + values[:, t] * loss_mask[:, t]
        out[:, t] = running * ends[:, t]
        running = running * (1 - ends[:, t])
    return out


def cumulative_returns(rewards, gamma):
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
    return returns


def response_log_probs(model, input_ids, attention_mask, response_length):
    logits = model(input_ids, attention_mask=attention_mask).logits[:, -response_length - 1 : -1]
    return F.log_softmax(logits, dim=-1).gather(-1, input_ids[:, -response_length:].unsqueeze(-1)).squeeze(-1)


class MultiTurnTrainer:
    def __init__(self, policy, ref_policy, optimizer, cfg=None):
        self.policy = policy
        self.ref_policy = ref_policy
        self.optimizer = optimizer
        self.cfg = cfg or TrainerConfig()

    @torch.no_grad()
    def rollout_postprocess(self, batch):
        loss_mask = batch["loss_mask"]
        T = loss_mask.shape[1]
        action_log_probs = response_log_probs(self.policy, batch["input_ids"], batch["attention_mask"], T)
        base_action_log_probs = response_log_probs(self.ref_policy, batch["input_ids"], batch["attention_mask"], T)
        # error: KL006
        log_ratio = action_log_probs - base_action_log_probs
        turn_kl = sum_per_turn(log_ratio, loss_mask)
        kl_reward = self.cfg.kl_coef * turn_kl
        rewards = batch["turn_rewards"] + kl_reward
        batch["old_log_probs"] = action_log_probs
        batch["returns"] = cumulative_returns(rewards, self.cfg.gamma)
        return batch

    def compute_loss(self, batch):
        loss_mask = batch["loss_mask"]
        log_probs = response_log_probs(self.policy, batch["input_ids"], batch["attention_mask"], loss_mask.shape[1])
        ratio = torch.exp(log_probs - batch["old_log_probs"])
        return -(ratio * batch["returns"] * loss_mask).sum(-1).mean()

    def step(self, batch):
        batch = self.rollout_postprocess(batch)
        loss = self.compute_loss(batch)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.item()
