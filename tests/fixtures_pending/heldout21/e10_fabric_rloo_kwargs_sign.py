"""RLOO fine-tuning step written against Lightning Fabric: sequence-level REINFORCE, KL and entropy."""

from dataclasses import dataclass
from typing import Dict

import torch


@dataclass
class RLOOConfig:
    rloo_k: int = 4
    kl_coef: float = 0.05
    ent_coef: float = 0.001
    temperature: float = 1.0


def reduce_policy_losses(*, pg_loss, entropy, kl, ent_coef: float, kl_coef: float, **unused) -> torch.Tensor:
    """Combine the policy terms into the scalar that is minimised.

    The regularisers are weighted relative to the policy-gradient loss.
    """
    # error: KL006
    return pg_loss - ent_coef * entropy - kl_coef * kl


class RLOOLearner:
    def __init__(self, fabric, policy, optimizer, config: RLOOConfig):
        self.fabric = fabric
        self.policy = policy
        self.optimizer = optimizer
        self.config = config

    def training_step(self, batch: Dict[str, torch.Tensor]) -> Dict[str, float]:
        input_ids = batch["input_ids"]
        response_mask = batch["response_mask"].float()
        response_len = response_mask.size(1)

        logits = self.policy(input_ids).logits[:, -response_len - 1 : -1] / self.config.temperature
        all_logprobs = logits.float().log_softmax(dim=-1)
        token_logprobs = all_logprobs.gather(-1, input_ids[:, -response_len:, None]).squeeze(-1)
        seq_logprobs = (token_logprobs * response_mask).sum(dim=-1)

        # leave-one-out baseline within each group of k samples of the same prompt
        scores = batch["scores"].view(-1, self.config.rloo_k)
        baseline = (scores.sum(dim=1, keepdim=True) - scores) / (self.config.rloo_k - 1)
        advantages = (scores - baseline).view(-1)
        pg_loss = -(advantages * seq_logprobs).mean()

        token_entropy = -(all_logprobs.exp() * all_logprobs).sum(dim=-1)
        entropy = (token_entropy * response_mask).sum() / response_mask.sum()

        seq_log_ratio = seq_logprobs - batch["ref_seq_logprobs"]
        kl = 0.5 * seq_log_ratio.square().mean()

        terms = {"pg_loss": pg_loss, "entropy": entropy, "kl": kl}
        loss = reduce_policy_losses(**terms, ent_coef=self.config.ent_coef, kl_coef=self.config.kl_coef)

        self.optimizer.zero_grad()
        self.fabric.backward(loss)
        self.fabric.clip_gradients(self.policy, self.optimizer, max_norm=1.0)
        self.optimizer.step()
        return {k: v.item() for k, v in terms.items()} | {"loss": loss.item()}
