"""Single-process rendition of verl's DataParallelPPOActor.update_policy."""

import torch

from . import core_algos
from .config import actor_config

__all__ = ["DataParallelPPOActor"]


class DataParallelPPOActor:
    def __init__(self, actor_module, actor_optimizer=None, config=None):
        self.config = config if config is not None else actor_config()
        self.actor_module = actor_module
        self.actor_optimizer = actor_optimizer
        self.use_kl_loss = self.config["use_kl_loss"]
        self.kl_loss_type = self.config["kl_loss_type"]
        self.kl_loss_coef = self.config["kl_loss_coef"]
        self.loss_agg_mode = self.config["loss_agg_mode"]

    def _forward_micro_batch(self, micro_batch, temperature):
        response_length = micro_batch["responses"].size(-1)
        output = self.actor_module(
            input_ids=micro_batch["input_ids"],
            attention_mask=micro_batch["attention_mask"],
            use_cache=False,
        )
        logits = output.logits
        logits.div_(temperature)
        logits = logits[:, -response_length - 1 : -1, :]  # (bsz, response_length, vocab_size)
        log_probs = core_algos.logprobs_from_logits(logits, micro_batch["responses"])
        return log_probs

    @staticmethod
    def _split(batch, micro_batch_size):
        size = batch["input_ids"].shape[0]
        for start in range(0, size, micro_batch_size):
            yield {k: v[start : start + micro_batch_size] for k, v in batch.items()}

    def _optimizer_step(self):
        grad_norm = torch.nn.utils.clip_grad_norm_(self.actor_module.parameters(), max_norm=self.config["grad_clip"])
        if self.actor_optimizer is not None:
            self.actor_optimizer.step()
        return grad_norm

    def update_policy(self, data):
        temperature = data.meta_info["temperature"]
        select_keys = ["responses", "input_ids", "attention_mask", "response_mask", "old_log_probs", "advantages"]
        if self.use_kl_loss:
            select_keys.append("ref_log_prob")
        batch = {k: data.batch[k] for k in select_keys}

        metrics = {}
        micro_bsz = self.config["ppo_micro_batch_size_per_gpu"]
        gradient_accumulation = max(1, self.config["ppo_mini_batch_size"] // micro_bsz)
        for _ in range(self.config["ppo_epochs"]):
            if self.actor_optimizer is not None:
                self.actor_optimizer.zero_grad()
            for micro_batch in self._split(batch, micro_bsz):
                response_mask = micro_batch["response_mask"]
                old_log_prob = micro_batch["old_log_probs"]
                advantages = micro_batch["advantages"]

                log_prob = self._forward_micro_batch(micro_batch, temperature=temperature)

                # ok: KL001
                pg_loss, pg_clipfrac, ppo_kl = core_algos.compute_policy_loss(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages, response_mask=response_mask, cliprange=self.config["clip_ratio"], loss_agg_mode=self.loss_agg_mode)
                policy_loss = pg_loss

                if self.use_kl_loss:
                    ref_log_prob = micro_batch["ref_log_prob"]
                    # error: KL002
                    kld = core_algos.kl_penalty(logprob=log_prob, ref_logprob=ref_log_prob, kl_penalty=self.kl_loss_type)
                    kl_loss = core_algos.agg_loss(loss_mat=kld, loss_mask=response_mask, loss_agg_mode=self.loss_agg_mode)
                    policy_loss = policy_loss + kl_loss * self.kl_loss_coef
                    metrics["actor/kl_loss"] = kl_loss.detach().item()
                    metrics["actor/kl_coef"] = self.kl_loss_coef

                loss = policy_loss / gradient_accumulation
                loss.backward()

                metrics["actor/pg_loss"] = pg_loss.detach().item()
                metrics["actor/pg_clipfrac"] = pg_clipfrac.detach().item()
                metrics["actor/ppo_kl"] = ppo_kl.detach().item()

            metrics["actor/grad_norm"] = float(self._optimizer_step())
        return metrics
