"""RLOO learner (oat/TRL-style layout) with a sequence-level KL reward and a double negative.

Each prompt has `rloo_k` samples laid out as k blocks of the batch. Under no_grad
the learner forms the sequence log-ratio of the policy to the reference and the
penalty `non_score_reward = -kl_coef * kl` (negative for a positive KL), then
*subtracts* that penalty from the scores: `rewards = scores - non_score_reward`,
i.e. scores + kl_coef * kl. Leave-one-out advantages weight the sequence
log-prob in the loss handed to `accelerator.backward`.

Bug (KL006, at the `rewards = ...` line): with a leave-one-out baseline the KL
part of the expected gradient of the loss is
-kl_coef * E[sum_t logr_t * grad log pi(y)] = -kl_coef * grad KL(pi||pi_ref): the
penalty enters the minimised loss with a negative sign, so every step moves the
policy *away* from the reference. `scores + non_score_reward` was meant.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RLOOArgs:
    rloo_k: int = 4
    kl_coef: float = 0.05
    max_grad_norm: float = 1.0
    temperature: float = 1.0


class RLOOLearner:
    def __init__(self, policy, ref_policy, optimizer, accelerator, args: RLOOArgs):
        self.policy = policy
        self.ref_policy = ref_policy
        self.optimizer = optimizer
        self.accelerator = accelerator
        self.args = args

    def _completion_logps(self, model, query_responses, attention_mask, context_length: int):
        logits = model(input_ids=query_responses, attention_mask=attention_mask).logits
        logits = logits[:, context_length - 1 : -1] / self.args.temperature
        responses = query_responses[:, context_length:]
        return torch.log_softmax(logits, dim=-1).gather(2, responses.unsqueeze(-1)).squeeze(-1)

    def learn_step(self, query_responses, attention_mask, response_mask, scores, context_length: int):
        k = self.args.rloo_k
        token_logps = self._completion_logps(self.policy, query_responses, attention_mask, context_length)
        seq_logps = (token_logps * response_mask).sum(dim=1)

        with torch.no_grad():
            ref_token_logps = self._completion_logps(self.ref_policy, query_responses, attention_mask, context_length)
            ref_seq_logps = (ref_token_logps * response_mask).sum(dim=1)
            kl = seq_logps.detach() - ref_seq_logps
            non_score_reward = -self.args.kl_coef * kl
            # error: KL006
            rewards = scores - non_score_reward
            rewards = rewards.reshape(k, -1)
            baseline = (rewards.sum(dim=0, keepdim=True) - rewards) / (k - 1)
            advantages = (rewards - baseline).flatten()

        loss = -(advantages * seq_logps).mean()
        self.optimizer.zero_grad()
        self.accelerator.backward(loss)
        if self.accelerator.sync_gradients:
            self.accelerator.clip_grad_norm_(self.policy.parameters(), self.args.max_grad_norm)
        self.optimizer.step()
        return {"loss": loss.item(), "objective/kl": kl.mean().item(), "objective/scores": scores.mean().item()}
