# Reviewer: verl-style actor whose KL loss is built column by column: the
# response log-probs and the reference log-probs are unbound along time, paired
# with zip, and itertools.starmap(operator.sub, ...) forms logp_t - ref_t for each
# position; the masked columns are folded with functools.reduce(operator.add).
# That is the k1 estimate of each sequence, with its gradient, used as a loss:
# grad = sum_t grad logp_t, whose expectation under pi is zero.
# Verdict: bug, KL001, reported on the starmap line that computes the estimate
# inside compute_kl_loss (a helper given log-probs that forms the estimate itself).
import operator
from functools import reduce
from itertools import starmap

import torch

from verl import DataProto
from verl.utils.torch_functional import logprobs_from_logits


class ColumnwiseKLActor:
    def __init__(self, config, actor_module=None, actor_optimizer=None):
        self.config = config
        self.actor_module = actor_module
        self.actor_optimizer = actor_optimizer

    def compute_pg_loss(self, log_prob, old_log_prob, advantages, response_mask):
        clip = self.config.get("clip_ratio", 0.2)
        ratio = torch.exp(log_prob - old_log_prob)
        losses = torch.maximum(-advantages * ratio, -advantages * torch.clamp(ratio, 1 - clip, 1 + clip))
        return (losses * response_mask).sum(-1).mean()

    def compute_kl_loss(self, log_prob, ref_log_prob, response_mask):
        columns = zip(log_prob.unbind(-1), ref_log_prob.unbind(-1))
        # error: KL001
        kl_cols = list(starmap(operator.sub, columns))
        masked = map(operator.mul, kl_cols, response_mask.unbind(-1))
        kl_per_seq = reduce(operator.add, masked)
        return kl_per_seq.mean()

    def policy_loss(self, log_prob, old_log_prob, ref_log_prob, advantages, response_mask):
        pg_loss = self.compute_pg_loss(log_prob, old_log_prob, advantages, response_mask)
        kl_loss = self.compute_kl_loss(log_prob, ref_log_prob, response_mask)
        loss = pg_loss + self.config.get("kl_loss_coef", 0.001) * kl_loss
        return loss, {"actor/pg_loss": pg_loss.item(), "actor/kl_loss": kl_loss.item()}

    def update_policy(self, data: DataProto):
        self.actor_module.train()
        metrics = {}
        for mb in data.split(self.config.get("ppo_micro_batch_size", 8)):
            out = self.actor_module(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"])
            logits = out.logits[:, -mb["responses"].shape[-1] - 1 : -1]
            log_prob = logprobs_from_logits(logits, mb["responses"])
            loss, m = self.policy_loss(
                log_prob, mb["old_log_probs"], mb["ref_log_prob"], mb["advantages"], mb["response_mask"]
            )
            loss.backward()
            metrics.update(m)
        self.actor_optimizer.step()
        self.actor_optimizer.zero_grad()
        return metrics
