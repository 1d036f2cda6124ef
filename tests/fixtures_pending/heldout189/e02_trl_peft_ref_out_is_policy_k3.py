# Reviewer: TRL-style GRPO trainer on a PEFT model. `ref_out` is NOT the
# reference model: it is the policy's per-token log-probs computed with the
# slow "reference implementation" of selective log-softmax (used instead of the
# fused kernel for numerical parity), with gradient. The reference policy is
# the base model with the adapter disabled, under no_grad, stored in `base`.
# `_grpo_loss` therefore differentiates exp(base - ref_out) - (base - ref_out) - 1,
# which is k3 of KL(pi||pi_ref) with a gradient through the policy, summed over
# tokens: its expected gradient is the token-level grad KL(pi_ref||pi).
# Verdict: bug, KL002, reported where the estimate is computed (`per_token_kl`
# in _grpo_loss).
import torch

from trl import GRPOTrainer
from trl.trainer.utils import selective_log_softmax


def reference_selective_log_softmax(logits, index):
    # reference (unfused) implementation, kept for parity tests
    logps = torch.log_softmax(logits.float(), dim=-1)
    return torch.gather(logps, -1, index.unsqueeze(-1)).squeeze(-1)


class ParityGRPOTrainer(GRPOTrainer):
    use_reference_impl = True
    beta = 0.04

    def _per_token_logps(self, model, input_ids, attention_mask, logits_to_keep):
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        logits = logits[:, -logits_to_keep - 1 : -1] / self.temperature
        completion_ids = input_ids[:, -logits_to_keep:]
        if self.use_reference_impl:
            return reference_selective_log_softmax(logits, completion_ids)
        return selective_log_softmax(logits, completion_ids)

    def _grpo_loss(self, ref_out, base, advantages, completion_mask):
        coef = torch.exp(ref_out - ref_out.detach())
        # error: KL002
        per_token_kl = torch.exp(base - ref_out) - (base - ref_out) - 1
        per_token_loss = -coef * advantages.unsqueeze(1) + self.beta * per_token_kl
        return (per_token_loss * completion_mask).sum(dim=1).mean()

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        logits_to_keep = completion_ids.size(1)

        ref_out = self._per_token_logps(model, input_ids, attention_mask, logits_to_keep)
        with torch.no_grad(), self.accelerator.unwrap_model(model).disable_adapter():
            base = self._per_token_logps(model, input_ids, attention_mask, logits_to_keep)

        loss = self._grpo_loss(ref_out, base, inputs["advantages"], completion_mask)
        self._metrics["train"]["kl"].append(((base - ref_out).exp() - (base - ref_out) - 1).mean().item())
        return loss
