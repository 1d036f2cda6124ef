# Reviewer: same TRL-style GRPO trainer as e03, but the default is
# kl_direction = "forward": the author asks for KL(pi_ref||pi) (mass-covering)
# on purpose. On completions sampled from pi it uses the sequence importance
# weight w = pi_ref(y)/pi(y) (detached): the value w*log w is an unbiased
# estimate of KL(pi_ref||pi), and the gradient -w * grad log pi(y) has
# expectation -E_pi_ref[grad log pi(y)] = grad KL(pi_ref||pi) of the sequence,
# exactly the divergence the config names. The "reverse" branch is k2 of the
# sequence log-ratio: grad KL(pi||pi_ref), also correct.
# Verdict: correct. A gradient of KL(pi_ref||pi) that was intended is no KL002.
from dataclasses import dataclass, field

import torch

from trl import GRPOConfig, GRPOTrainer


@dataclass
class DirectionalGRPOConfig:
    beta: float = 0.04
    epsilon: float = 0.2
    kl_direction: str = field(default="forward", metadata={"help": "reverse: KL(pi||pi_ref); forward: KL(pi_ref||pi)"})
    max_completion_length: int = 256


class DirectionalGRPOTrainer:
    def __init__(self, args: DirectionalGRPOConfig, model=None, ref_model=None):
        self.args = args
        self.model = model
        self.ref_model = ref_model
        self._metrics = {"kl": [], "clip_ratio": []}

    def _per_token_logps(self, model, input_ids, attention_mask, logits_to_keep):
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -logits_to_keep - 1 : -1]
        return torch.gather(logits.log_softmax(-1), 2, input_ids[:, -logits_to_keep:, None]).squeeze(-1)

    def _grpo_loss(self, per_token_logps, old_per_token_logps, ref_per_token_logps, advantages, completion_mask):
        coef_1 = torch.exp(per_token_logps - old_per_token_logps)
        coef_2 = torch.clamp(coef_1, 1 - self.args.epsilon, 1 + self.args.epsilon)
        per_token_loss = -torch.min(coef_1 * advantages.unsqueeze(1), coef_2 * advantages.unsqueeze(1))
        seq_loss = (per_token_loss * completion_mask).sum(dim=1)
        if self.args.beta != 0.0:
            if self.args.kl_direction == "reverse":
                seq_log_ratio = ((per_token_logps - ref_per_token_logps) * completion_mask).sum(dim=1)
                seq_kl = 0.5 * seq_log_ratio.square()
            elif self.args.kl_direction == "forward":
                seq_logps = (per_token_logps * completion_mask).sum(dim=1)
                seq_log_w = ((ref_per_token_logps - per_token_logps) * completion_mask).sum(dim=1).detach()
                # ok: KL002
                seq_kl = seq_log_w.exp() * (seq_log_w - (seq_logps - seq_logps.detach()))
            else:
                raise ValueError(self.args.kl_direction)
            seq_loss = seq_loss + self.args.beta * seq_kl
            self._metrics["kl"].append(seq_kl.detach().mean().item())
        return seq_loss.mean()

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        logits_to_keep = completion_ids.size(1)
        per_token_logps = self._per_token_logps(model, input_ids, attention_mask, logits_to_keep)
        with torch.no_grad():
            ref_per_token_logps = self._per_token_logps(self.ref_model, input_ids, attention_mask, logits_to_keep)
        old = inputs.get("old_per_token_logps")
        old = per_token_logps.detach() if old is None else old
        return self._grpo_loss(per_token_logps, old, ref_per_token_logps, inputs["advantages"], inputs["completion_mask"])
