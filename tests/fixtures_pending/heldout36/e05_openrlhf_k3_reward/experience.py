from pathlib import Path

import torch
import yaml

from .utils import compute_reward, get_cumulative_returns


def load_ppo_config(path=None):
    with open(path or Path(__file__).parent / "config" / "ppo.yaml") as f:
        return yaml.safe_load(f)


class ExperienceMaker:
    def __init__(self, actor, initial_model, reward_fn, cfg=None):
        self.actor, self.initial_model, self.reward_fn = actor, initial_model, reward_fn
        self.cfg = cfg or load_ppo_config()

    @torch.no_grad()
    def make_experience(self, sequences, attention_mask, action_mask, num_actions):
        action_log_probs = self.actor(sequences, num_actions, attention_mask)
        base_action_log_probs = self.initial_model(sequences, num_actions, attention_mask)
        r = self.reward_fn(sequences, attention_mask)
        rewards, kl = compute_reward(
            r, self.cfg["init_kl_coef"], action_log_probs, base_action_log_probs, action_mask,
            kl_estimator=self.cfg["kl_estimator"],
        )
        returns = get_cumulative_returns(rewards, action_mask, self.cfg["gamma"])
        return {
            "sequences": sequences, "attention_mask": attention_mask, "action_mask": action_mask,
            "num_actions": num_actions, "returns": returns, "kl": (kl.sum(-1)).mean().item(),
        }
