"""Online DPO with an explicit KL regulariser, on a DeepSpeed engine.

Two completions per prompt are sampled from the current policy, a judge
picks the preferred one, and the DPO loss is applied to the pair. On top of
it, a KL penalty to the SFT model keeps the policy from drifting; its
estimator is selected by ``KLMode``.
"""

from dataclasses import dataclass
from enum import Enum

import torch
import torch.nn.functional as F


class KLMode(str, Enum):
    TOKEN_K1 = "token_k1"
    TOKEN_K3 = "token_k3"
    SEQUENCE_K2 = "sequence_k2"


@dataclass
class OnlineDPOConfig:
    beta: float = 0.1
    kl_coef: float = 0.05
    kl_mode: KLMode = KLMode.SEQUENCE_K2
    max_new_tokens: int = 256


def kl_regulariser(logps, ref_logps, mask, mode: KLMode):
    """Per-sequence KL(pi || pi_ref) penalty of sampled completions."""
    log_ratio = (logps - ref_logps) * mask
    if mode is KLMode.TOKEN_K1:
        return log_ratio.sum(-1)
    if mode is KLMode.TOKEN_K3:
        return ((torch.exp(-log_ratio) + log_ratio - 1) * mask).sum(-1)
    seq_log_ratio = log_ratio.sum(-1)
    return 0.5 * seq_log_ratio.square()


class OnlineDPOTrainer:
    def __init__(self, engine, ref_model, judge, config: OnlineDPOConfig = OnlineDPOConfig()):
        self.engine = engine  # deepspeed.initialize(...)[0]
        self.ref_model = ref_model
        self.judge = judge
        self.config = config

    @staticmethod
    def _completion_logps(model, input_ids, attention_mask, prompt_len):
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, prompt_len - 1 : -1]
        return torch.gather(logits.log_softmax(-1), 2, input_ids[:, prompt_len:].unsqueeze(-1)).squeeze(-1)

    @torch.no_grad()
    def generate_pair(self, prompt_ids, prompt_mask):
        gen = self.engine.module.generate
        kwargs = dict(attention_mask=prompt_mask, do_sample=True, max_new_tokens=self.config.max_new_tokens)
        return gen(prompt_ids, **kwargs), gen(prompt_ids, **kwargs)

    def step(self, prompt_ids, seq_a, seq_b, mask_a, mask_b):
        prompt_len = prompt_ids.shape[1]
        batch_size = prompt_ids.shape[0]
        prefer_a = self.judge(seq_a, seq_b)  # bool [B]
        chosen = torch.where(prefer_a[:, None], seq_a, seq_b)
        rejected = torch.where(prefer_a[:, None], seq_b, seq_a)
        chosen_mask = torch.where(prefer_a[:, None], mask_a, mask_b)
        rejected_mask = torch.where(prefer_a[:, None], mask_b, mask_a)

        input_ids = torch.cat([chosen, rejected], dim=0)
        completion_mask = torch.cat([chosen_mask, rejected_mask], dim=0)
        attention_mask = torch.cat([torch.ones_like(input_ids[:, :prompt_len]), completion_mask.long()], dim=1)

        logps = self._completion_logps(self.engine, input_ids, attention_mask, prompt_len)
        with torch.no_grad():
            ref_logps = self._completion_logps(self.ref_model, input_ids, attention_mask, prompt_len)

        seq_logps = (logps * completion_mask).sum(-1)
        seq_ref_logps = (ref_logps * completion_mask).sum(-1)
        # ok: KL001
        chosen_logratios = seq_logps[:batch_size] - seq_ref_logps[:batch_size]
        rejected_logratios = seq_logps[batch_size:] - seq_ref_logps[batch_size:]
        dpo_loss = -F.logsigmoid(self.config.beta * (chosen_logratios - rejected_logratios)).mean()

        # both completions are on-policy samples, so both carry the KL penalty
        # ok: KL003
        kl = kl_regulariser(logps, ref_logps, completion_mask, self.config.kl_mode)
        loss = dpo_loss + self.config.kl_coef * kl.mean()

        self.engine.backward(loss)
        self.engine.step()

        return {
            "loss/dpo": dpo_loss.item(),
            "objective/kl": kl.mean().item(),
            "rewards/margins": (self.config.beta * (chosen_logratios - rejected_logratios)).mean().item(),
        }
