# Reviewer: the actor worker. kl_penalty and agg_loss come from the package
# root, i.e. whatever __init__ bound last under those names.
import torch

from verl import DataProto
from verl.utils.torch_functional import logprobs_from_logits

from . import agg_loss, kl_penalty


class DataParallelPPOActor:
    def __init__(self, config, actor_module=None, actor_optimizer=None):
        self.config = config
        self.actor_module = actor_module
        self.actor_optimizer = actor_optimizer

    def _forward_micro_batch(self, micro_batch):
        output = self.actor_module(input_ids=micro_batch["input_ids"], attention_mask=micro_batch["attention_mask"])
        logits = output.logits[:, -micro_batch["responses"].shape[-1] - 1 : -1]
        return logprobs_from_logits(logits, micro_batch["responses"])

    def compute_policy_loss(self, log_prob, old_log_prob, ref_log_prob, advantages, response_mask):
        cfg = self.config
        ratio = torch.exp(log_prob - old_log_prob)
        pg_losses = -advantages * ratio
        pg_losses2 = -advantages * torch.clamp(ratio, 1 - cfg.clip_ratio, 1 + cfg.clip_ratio)
        pg_loss = agg_loss(torch.maximum(pg_losses, pg_losses2), response_mask)
        metrics = {"actor/pg_loss": pg_loss.item()}
        policy_loss = pg_loss
        if cfg.use_kl_loss:
            # error: KL001
            kld = kl_penalty(log_prob, ref_log_prob, response_mask)
            kl_loss = agg_loss(kld, response_mask)
            policy_loss = policy_loss + cfg.kl_loss_coef * kl_loss
            metrics["actor/kl_loss"] = kl_loss.item()
        return policy_loss, metrics

    def update_policy(self, data: DataProto):
        self.actor_module.train()
        metrics = {}
        for micro_batch in data.split(self.config.ppo_micro_batch_size):
            log_prob = self._forward_micro_batch(micro_batch)
            loss, m = self.compute_policy_loss(
                log_prob,
                micro_batch["old_log_probs"],
                micro_batch["ref_log_prob"],
                micro_batch["advantages"],
                micro_batch["response_mask"],
            )
            loss.backward()
            metrics.update(m)
        self.actor_optimizer.step()
        self.actor_optimizer.zero_grad()
        return metrics
