# Reviewer: TRL-style GRPO trainer with an in-house KL option. KLGRPOConfig.__post_init__
# strips and lower-cases `kl_estimator` and maps aliases through _KL_ALIASES; the default
# "Low-Var-KL" becomes "k3". The loss then resolves getattr(self, f"_kl_{name}") and adds the
# per-token k3 (with gradient) to the per-token loss, summed over tokens. Its expected gradient
# is the token-level gradient of KL(pi_ref||pi), not grad KL(pi||pi_ref).
# Verdict: bug, KL002, reported where the loss calls the dispatched helper (`per_token_kl = kl_fn(...)`).
from dataclasses import dataclass

import torch

from trl.trainer.utils import selective_log_softmax

_KL_ALIASES = {
    "k1": "k1",
    "kl": "k1",
    "naive": "k1",
    "k2": "k2",
    "mse": "k2",
    "l2": "k2",
    "k3": "k3",
    "low_var_kl": "k3",
    "low-var-kl": "k3",
    "schulman": "k3",
}


@dataclass
class KLGRPOConfig:
    beta: float = 0.04
    epsilon: float = 0.2
    kl_estimator: str = "Low-Var-KL"
    max_completion_length: int = 256

    def __post_init__(self):
        key = self.kl_estimator.strip().lower()
        if key not in _KL_ALIASES:
            raise ValueError(f"kl_estimator must be one of {sorted(_KL_ALIASES)}, got {self.kl_estimator!r}")
        self.kl_estimator = _KL_ALIASES[key]


class KLGRPOTrainer:
    def __init__(self, model, ref_model, args: KLGRPOConfig):
        self.model = model
        self.ref_model = ref_model
        self.args = args
        self.beta = args.beta

    def _kl_k1(self, logps, ref_logps):
        return logps - ref_logps

    def _kl_k2(self, logps, ref_logps):
        return 0.5 * (logps - ref_logps) ** 2

    def _kl_k3(self, logps, ref_logps):
        return torch.exp(ref_logps - logps) - (ref_logps - logps) - 1

    def _get_per_token_logps(self, model, input_ids, attention_mask, logits_to_keep):
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -logits_to_keep - 1 : -1]
        return selective_log_softmax(logits, input_ids[:, -logits_to_keep:])

    def _grpo_loss(self, per_token_logps, old_per_token_logps, ref_per_token_logps, advantages, completion_mask):
        coef_1 = torch.exp(per_token_logps - old_per_token_logps)
        coef_2 = torch.clamp(coef_1, 1 - self.args.epsilon, 1 + self.args.epsilon)
        per_token_loss1 = coef_1 * advantages.unsqueeze(1)
        per_token_loss2 = coef_2 * advantages.unsqueeze(1)
        per_token_loss = -torch.min(per_token_loss1, per_token_loss2)
        if self.beta != 0.0:
            kl_fn = getattr(self, f"_kl_{self.args.kl_estimator}")
            # error: KL002
            per_token_kl = kl_fn(per_token_logps, ref_per_token_logps)
            per_token_loss = per_token_loss + self.beta * per_token_kl
        return (per_token_loss * completion_mask).sum(-1).mean()

    def compute_loss(self, model, inputs):
        prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        logits_to_keep = completion_ids.size(1)
        per_token_logps = self._get_per_token_logps(model, input_ids, attention_mask, logits_to_keep)
        return self._grpo_loss(
            per_token_logps,
            inputs.get("old_per_token_logps", per_token_logps.detach()),
            inputs["ref_per_token_logps"],
            inputs["advantages"],
            inputs["completion_mask"],
        )
