"""On-policy RLOO with an exact (full-vocabulary) KL penalty, NeMo-RL style.

The penalty is meant to be the KL between the policy's and the reference's
*response* distributions, KL(pi(.|x) || pi_ref(.|x)).  Rather than a sampled
estimate, the loss uses the exact divergence between the two next-token
distributions at every position of the sampled response, from the logits.
"""

from dataclasses import dataclass
from typing import Any, Dict, Tuple

import torch


@dataclass
class RLOOLossConfig:
    reference_policy_kl_penalty: float = 0.02
    num_generations_per_prompt: int = 4
    temperature: float = 1.0


def full_vocab_kl(
    logits: torch.Tensor,
    ref_logits: torch.Tensor,
    token_mask: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """KL(pi(.|y_<t) || pi_ref(.|y_<t)) summed over the response, one value per sample."""
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    ref_logp = torch.log_softmax(ref_logits.float() / temperature, dim=-1)
    # error: KL003
    kl_t = (logp.exp() * (logp - ref_logp)).sum(dim=-1)
    return (kl_t * token_mask).sum(dim=-1)


class RLOOLossFn:
    def __init__(self, cfg: RLOOLossConfig = RLOOLossConfig()):
        self.cfg = cfg

    def __call__(
        self,
        logits: torch.Tensor,
        ref_logits: torch.Tensor,
        data: Dict[str, torch.Tensor],
    ) -> Tuple[torch.Tensor, Dict[str, Any]]:
        token_mask = data["token_mask"]
        input_ids = data["response_ids"]
        logp = torch.log_softmax(logits.float() / self.cfg.temperature, dim=-1)
        token_logprobs = torch.gather(logp, -1, input_ids.unsqueeze(-1)).squeeze(-1)
        seq_logprobs = (token_logprobs * token_mask).sum(dim=-1)

        rewards = data["rewards"].view(-1, self.cfg.num_generations_per_prompt)
        k = self.cfg.num_generations_per_prompt
        baseline = (rewards.sum(dim=1, keepdim=True) - rewards) / (k - 1)
        advantages = (rewards - baseline).view(-1)

        pg_loss = -(advantages * seq_logprobs).mean()
        kl = full_vocab_kl(logits, ref_logits, token_mask, temperature=self.cfg.temperature)
        kl_loss = self.cfg.reference_policy_kl_penalty * kl.mean()
        loss = pg_loss + kl_loss
        return loss, {"loss": loss.item(), "kl_penalty": kl_loss.item()}


def train_step(policy, reference_policy, optimizer, loss_fn: RLOOLossFn, microbatches) -> float:
    optimizer.zero_grad()
    total = 0.0
    for mb in microbatches:
        response_len = mb["response_ids"].size(1)
        logits = policy(mb["input_ids"]).logits[:, -response_len - 1 : -1]
        with torch.no_grad():
            ref_logits = reference_policy(mb["input_ids"]).logits[:, -response_len - 1 : -1]
        loss, metrics = loss_fn(logits, ref_logits, mb)
        (loss / len(microbatches)).backward()
        total += metrics["loss"]
    optimizer.step()
    return total
