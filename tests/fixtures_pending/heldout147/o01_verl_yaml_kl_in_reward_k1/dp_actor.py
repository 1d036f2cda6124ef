# Reviewer: verl-style PPO actor, same code as e01. The package's
# config/ppo_trainer.yaml here sets actor.use_kl_loss=false and
# algorithm.use_kl_in_reward=true with kl_penalty="kl": the k1 log-ratio is
# computed under no_grad from the (on-policy) old log-probs, subtracted from the
# token rewards, and credited by GAE with gamma = lam = 1 (a reward-to-go). The
# expected gradient is kl_coef * grad KL(pi||pi_ref) of the sequence. The k1
# loss branch in policy_loss is dead under the shipped config.
# Verdict: correct. The kl_penalty(...) call in policy_loss (not run) and the
# detached k1 reward stay silent.
from pathlib import Path

import torch
import yaml

from verl import DataProto
from verl.utils.torch_functional import logprobs_from_logits

CONFIG_PATH = Path(__file__).parent / "config" / "ppo_trainer.yaml"


def load_config(path=CONFIG_PATH):
    with open(path) as f:
        return yaml.safe_load(f)


def kl_penalty(logprob, ref_logprob, kl_penalty="kl"):
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        kl = torch.clamp(ref_logprob - logprob, min=-20, max=20)
        return torch.exp(kl) - kl - 1
    raise NotImplementedError(kl_penalty)


def agg_loss(values, mask, mode):
    if mode == "token-mean":
        return (values * mask).sum() / mask.sum().clamp(min=1)
    if mode == "seq-mean-token-sum":
        return (values * mask).sum(-1).mean()
    raise ValueError(mode)


@torch.no_grad()
def compute_gae(token_level_rewards, values, mask, gamma, lam):
    lastgaelam = torch.zeros_like(token_level_rewards[:, 0])
    advantages = []
    for t in reversed(range(token_level_rewards.shape[-1])):
        next_value = values[:, t + 1] if t + 1 < values.shape[-1] else 0.0
        delta = token_level_rewards[:, t] + gamma * next_value * mask[:, t] - values[:, t]
        lastgaelam = (delta + gamma * lam * lastgaelam) * mask[:, t]
        advantages.append(lastgaelam)
    return torch.stack(advantages[::-1], dim=-1) * mask


class KLAwarePPOActor:
    def __init__(self, config=None, actor_module=None, actor_optimizer=None):
        config = config or load_config()
        self.actor_cfg = config["actor_rollout_ref"]["actor"]
        self.algo_cfg = config["algorithm"]
        self.actor_module = actor_module
        self.actor_optimizer = actor_optimizer

    @torch.no_grad()
    def compute_advantages(self, batch):
        mask = batch["response_mask"]
        rewards = batch["token_level_scores"]
        if self.algo_cfg["use_kl_in_reward"]:
            beta = self.algo_cfg["kl_ctrl"]["kl_coef"]
            # ok: KL005
            kld = kl_penalty(batch["old_log_probs"], batch["ref_log_prob"], kl_penalty=self.algo_cfg["kl_penalty"])
            rewards = rewards - beta * kld * mask
        batch["token_level_rewards"] = rewards
        batch["advantages"] = compute_gae(rewards, batch["values"], mask, self.algo_cfg["gamma"], self.algo_cfg["lam"])
        return batch

    def policy_loss(self, log_prob, batch):
        cfg = self.actor_cfg
        mask = batch["response_mask"]
        ratio = torch.exp(log_prob - batch["old_log_probs"])
        adv = batch["advantages"]
        pg_losses = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - cfg["clip_ratio"], 1 + cfg["clip_ratio"]))
        loss = agg_loss(pg_losses, mask, cfg["loss_agg_mode"])
        metrics = {"actor/pg_loss": loss.item()}
        if cfg["use_kl_loss"]:
            # ok: KL001
            kld = kl_penalty(log_prob, batch["ref_log_prob"], kl_penalty=cfg["kl_loss_type"])
            kl_loss = agg_loss(kld, mask, cfg["loss_agg_mode"])
            loss = loss + cfg["kl_loss_coef"] * kl_loss
            metrics["actor/kl_loss"] = kl_loss.item()
        return loss, metrics

    def update_policy(self, data: DataProto):
        self.actor_module.train()
        metrics = {}
        for mb in data.split(self.actor_cfg["ppo_micro_batch_size"]):
            out = self.actor_module(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"])
            logits = out.logits[:, -mb["responses"].shape[-1] - 1 : -1]
            log_prob = logprobs_from_logits(logits, mb["responses"])
            loss, m = self.policy_loss(log_prob, mb)
            loss.backward()
            metrics.update(m)
        self.actor_optimizer.step()
        self.actor_optimizer.zero_grad()
        return metrics
