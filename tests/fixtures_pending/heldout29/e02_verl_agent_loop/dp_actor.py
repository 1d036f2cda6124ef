"""Actor: recomputes log-probs and runs the PPO update with gradient accumulation."""
import torch
import torch.nn.functional as F

from . import core_algos


class DataParallelPPOActor:
    def __init__(self, module, optimizer, ppo_micro_batch_size=1, clip_ratio=0.2, loss_agg_mode="seq-mean-token-sum"):
        self.actor_module = module
        self.actor_optimizer = optimizer
        self.ppo_micro_batch_size = ppo_micro_batch_size
        self.clip_ratio = clip_ratio
        self.loss_agg_mode = loss_agg_mode

    def _forward_micro_batch(self, micro_batch):
        input_ids = micro_batch["input_ids"]
        responses = micro_batch["responses"]
        response_length = responses.size(1)
        logits = self.actor_module(input_ids=input_ids, attention_mask=micro_batch["attention_mask"]).logits
        logits = logits[:, -response_length - 1 : -1, :]
        log_probs = F.log_softmax(logits, dim=-1)
        return log_probs.gather(-1, responses.unsqueeze(-1)).squeeze(-1)

    def compute_log_prob(self, data):
        with torch.no_grad():
            return self._forward_micro_batch(data.batch)

    def update_policy(self, data):
        keys = ["input_ids", "attention_mask", "responses", "response_mask", "old_log_probs", "advantages"]
        batch_size = data.batch["input_ids"].shape[0]
        micro_batches = [
            {k: data.batch[k][i : i + self.ppo_micro_batch_size] for k in keys}
            for i in range(0, batch_size, self.ppo_micro_batch_size)
        ]
        gradient_accumulation = len(micro_batches)
        self.actor_optimizer.zero_grad()
        metrics = []
        for micro_batch in micro_batches:
            log_prob = self._forward_micro_batch(micro_batch)
            pg_loss = core_algos.compute_policy_loss(
                old_log_prob=micro_batch["old_log_probs"],
                log_prob=log_prob,
                advantages=micro_batch["advantages"],
                response_mask=micro_batch["response_mask"],
                cliprange=self.clip_ratio,
                loss_agg_mode=self.loss_agg_mode,
            )
            loss = pg_loss / gradient_accumulation
            loss.backward()
            metrics.append(pg_loss.detach().item())
        self.actor_optimizer.step()
        return metrics
