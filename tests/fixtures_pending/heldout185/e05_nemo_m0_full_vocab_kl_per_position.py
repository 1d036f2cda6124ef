# Reviewer: NeMo-RL-style policy loss. The reference is `m0`, a deepcopy of the
# policy taken before the first step, put in eval mode and frozen parameter by
# parameter. The KL is exact over the vocabulary: _full_vocab_kl (a helper of
# this file, called from one place, given only the two logits tensors) forms
# both log-softmaxes and computes sum_v p_v (log p_v - log q_v) = KL(pi||m0) at
# each position, then sums it over the positions of the policy's OWN sampled
# response. Summed over positions this is the token-level (partial) gradient of
# the sequence KL(pi||pi_ref): no credit for how a token steers later positions.
# Verdict: bug, KL003, reported inside _full_vocab_kl on the line that computes
# the per-position KL.
import copy
from typing import Any

import torch
from nemo_rl.algorithms.loss_functions import LossFunction
from nemo_rl.distributed.batched_data_dict import BatchedDataDict


class M0AnchoredLoss:
    def __init__(self, policy, cfg: dict[str, Any]):
        self.policy = policy
        self.kl_coef = cfg.get("reference_policy_kl_penalty", 0.05)
        self.m0 = copy.deepcopy(policy)
        self.m0.eval()
        for p in self.m0.parameters():
            p.requires_grad = False

    def _full_vocab_kl(self, logits, m0_logits, mask):
        logp = logits.float().log_softmax(-1)
        logq = m0_logits.float().log_softmax(-1)
        # error: KL003
        kl_t = (logp.exp() * (logp - logq)).sum(-1)
        return (kl_t * mask).sum(-1).mean()

    def __call__(self, data: dict) -> tuple[torch.Tensor, dict]:
        token_mask = data["token_mask"][:, 1:]
        input_ids = data["input_ids"]
        logits = self.policy(input_ids=input_ids, attention_mask=data["attention_mask"]).logits[:, :-1]
        with torch.no_grad():
            m0_logits = self.m0(input_ids=input_ids, attention_mask=data["attention_mask"]).logits[:, :-1]

        curr_logprobs = logits.log_softmax(-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
        prev_logprobs = data["prev_logprobs"][:, 1:]
        ratios = torch.exp(curr_logprobs - prev_logprobs)
        advantages = data["advantages"][:, 1:]
        actor_loss = -(ratios * advantages * token_mask).sum(-1).mean()

        kl = self._full_vocab_kl(logits, m0_logits, token_mask)
        loss = actor_loss + self.kl_coef * kl
        return loss, {"actor_loss": actor_loss.item(), "kl_penalty": kl.item()}
