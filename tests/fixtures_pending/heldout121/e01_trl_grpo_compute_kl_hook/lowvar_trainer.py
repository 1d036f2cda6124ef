# Reviewer: the user overrides the single `compute_kl` hook of a TRL-style GRPO
# trainer with the "low variance" estimator of DeepSeekMath, k3 =
# exp(ref - logp) - (ref - logp) - 1, per token and with gradient. The base's
# unchanged `_compute_loss` adds `beta * per_token_kl` to the per-token loss and
# sums it over tokens. Verdict: bug (KL002). Differentiated k3 has expected
# gradient (1 - exp(-x_t)) grad logp_t per token: the token-level gradient of
# KL(pi_ref||pi), not grad KL(pi||pi_ref). The hook is given the log-probs and
# returns the estimate, so the finding is at the call in the base's loss.
import torch

from .base import KLHookGRPOTrainer


class LowVarKLGRPOTrainer(KLHookGRPOTrainer):
    """GRPO with the k3 ("low_var_kl") penalty."""

    def compute_kl(self, per_token_logps, ref_per_token_logps, completion_mask):
        delta = ref_per_token_logps - per_token_logps
        return torch.exp(delta) - delta - 1
