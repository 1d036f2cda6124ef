# Reviewer: the second minus sign is on the `pg_objective - kl_utils.kl_objective_term(...)`
# line: the helper's value is already -coef * KL, so this adds +coef * KL to the objective.
import torch

from . import kl_utils


class DataParallelPPOActor:
    def __init__(self, actor_module, actor_optimizer, config):
        self.actor_module = actor_module
        self.actor_optimizer = actor_optimizer
        self.config = config  # config.kl_loss_coef, config.ppo_micro_batch_size, ...

    def _forward_log_prob(self, input_ids, attention_mask, response_length):
        logits = self.actor_module(input_ids=input_ids, attention_mask=attention_mask).logits
        logits = logits[:, -response_length - 1 : -1]
        responses = input_ids[:, -response_length:]
        return torch.gather(logits.log_softmax(-1), 2, responses.unsqueeze(-1)).squeeze(-1)

    def compute_objective(self, log_prob, ref_log_prob, advantages, eos_mask):
        pg_objective = ((advantages * log_prob) * eos_mask).sum(-1).mean()
        # error: KL006
        objective = pg_objective - kl_utils.kl_objective_term(log_prob, ref_log_prob, eos_mask, self.config.kl_loss_coef)
        return objective

    def update_policy(self, micro_batches):
        self.actor_optimizer.zero_grad()
        metrics = {"actor/kl": []}
        for mb in micro_batches:
            response_length = mb["responses"].size(-1)
            log_prob = self._forward_log_prob(mb["input_ids"], mb["attention_mask"], response_length)
            objective = self.compute_objective(log_prob, mb["ref_log_prob"], mb["advantages"], mb["eos_mask"])
            loss = -objective / len(micro_batches)
            loss.backward()
            metrics["actor/kl"].append(kl_utils.kl_metric(log_prob, mb["ref_log_prob"], mb["eos_mask"]))
        self.actor_optimizer.step()
        return metrics
