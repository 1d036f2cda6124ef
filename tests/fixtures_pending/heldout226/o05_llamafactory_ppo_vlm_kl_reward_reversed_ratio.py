# Reviewer: LLaMA-Factory-style CustomPPOTrainer for a LoRA Qwen2-VL with a
# value head, same skeleton as e05 (rollout log-probs past the image/prompt
# tokens, reference = the same VLM with the adapter disabled). compute_rewards()
# (no grad) writes the log-ratio the other way round, `kl = ref_logprob -
# logprob`, and ADDS it: `non_score_reward = kl_ctl * kl` = -kl_coef *
# (logp - ref), the usual KL penalty. GAE with gamma = lam = 1 credits it as a
# reward-to-go, so the KL part of the minimised PPO loss has expected gradient
# +kl_coef * grad KL(pi||pi_ref).
# Verdict: correct. The reversed log-ratio is not a sign error here.
from dataclasses import dataclass
from typing import List

import torch

from llamafactory.extras.misc import get_logits_processor
from trl import PPOTrainer
from trl.core import logprobs_from_logits


@dataclass
class FinetuningArguments:
    ppo_kl_coef: float = 0.05
    ppo_gamma: float = 1.0
    ppo_lam: float = 1.0
    ppo_cliprange: float = 0.2
    ppo_vf_coef: float = 0.1
    ppo_whiten_advantages: bool = False


class FixedKLController:
    def __init__(self, kl_coef):
        self.value = kl_coef


class CustomPPOTrainer:
    def __init__(self, finetuning_args: FinetuningArguments, model=None, processor=None):
        self.args = finetuning_args
        self.model = model
        self.processor = processor
        self.kl_ctl = FixedKLController(finetuning_args.ppo_kl_coef)

    @torch.no_grad()
    def batched_forward_pass(self, model, queries, responses, mm_inputs):
        """Log-probs of the response only; the image tokens live in the query."""
        input_ids = torch.cat([queries, responses], dim=1)
        logits = model(input_ids=input_ids, **mm_inputs).logits
        logits = logits[:, queries.size(1) - 1 : -1]
        logprobs = logprobs_from_logits(logits, responses)
        with model.disable_adapter():  # the reference: same VLM without LoRA
            ref_logits = model(input_ids=input_ids, **mm_inputs).logits[:, queries.size(1) - 1 : -1]
        ref_logprobs = logprobs_from_logits(ref_logits, responses)
        return logprobs, ref_logprobs

    @torch.no_grad()
    def compute_rewards(self, scores: torch.Tensor, logprobs, ref_logprobs, masks):
        rewards, non_score_rewards, kls = [], [], []
        for score, logprob, ref_logprob, mask in zip(scores, logprobs, ref_logprobs, masks):
            # ok: KL006
            kl = ref_logprob - logprob
            kls.append(-kl)
            non_score_reward = self.kl_ctl.value * kl
            non_score_rewards.append(non_score_reward)
            reward = non_score_reward.clone() * mask
            last_non_masked_index = mask.nonzero()[-1]
            reward[last_non_masked_index] += score
            rewards.append(reward)
        return torch.stack(rewards), torch.stack(non_score_rewards), torch.stack(kls)

    @torch.no_grad()
    def compute_advantages(self, values, rewards, mask):
        gamma, lam = self.args.ppo_gamma, self.args.ppo_lam
        values, rewards = values * mask, rewards * mask
        lastgaelam, advantages_reversed = 0, []
        gen_len = rewards.shape[-1]
        for t in reversed(range(gen_len)):
            nextvalues = values[:, t + 1] if t < gen_len - 1 else 0.0
            delta = rewards[:, t] + gamma * nextvalues - values[:, t]
            lastgaelam = delta + gamma * lam * lastgaelam
            advantages_reversed.append(lastgaelam)
        advantages = torch.stack(advantages_reversed[::-1]).transpose(0, 1)
        returns = advantages + values
        if self.args.ppo_whiten_advantages:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        return values, advantages.detach(), returns

    def loss(self, old_logprobs, values, logprobs, vpreds, mask, advantages, returns):
        args = self.args
        ratio = torch.exp(logprobs - old_logprobs)
        pg_losses = -advantages * ratio
        pg_losses2 = -advantages * torch.clamp(ratio, 1.0 - args.ppo_cliprange, 1.0 + args.ppo_cliprange)
        pg_loss = (torch.max(pg_losses, pg_losses2) * mask).sum(-1).mean()
        vf_loss = 0.5 * (((vpreds - returns) ** 2) * mask).sum(-1).mean()
        return pg_loss + args.ppo_vf_coef * vf_loss

    def step(self, queries: List[torch.Tensor], responses: List[torch.Tensor], scores, mm_inputs, masks):
        logprobs, ref_logprobs = self.batched_forward_pass(self.model, queries, responses, mm_inputs)
        values = torch.zeros_like(logprobs)  # value head output, omitted here
        rewards, _, kls = self.compute_rewards(scores, logprobs, ref_logprobs, masks)
        values, advantages, returns = self.compute_advantages(values, rewards, masks)
        input_ids = torch.cat([queries, responses], dim=1)
        new_logits = self.model(input_ids=input_ids, **mm_inputs).logits[:, queries.size(1) - 1 : -1]
        new_logprobs = logprobs_from_logits(new_logits, responses)
        loss = self.loss(logprobs, values, new_logprobs, values, masks, advantages, returns)
        loss.backward()
        return {"objective/kl": (kls * masks).sum(1).mean().item(), "ppo/loss/total": loss.item()}
