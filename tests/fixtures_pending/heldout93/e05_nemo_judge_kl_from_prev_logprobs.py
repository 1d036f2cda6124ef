# Reviewer: NeMo-RL-style loss function for judge-scored self-play. The policy writes
# an argument, a frozen judge model compares it with the opponent seat's argument, and
# the judge's preference becomes the advantage. The loss is the clipped surrogate on
# `curr_logprobs` plus a KL penalty to the reference. The KL is k3, but it is built
# from `prev_logprobs` (the generation-time log-probs, stored without gradient) and the
# reference, not from the current log-probs; it is then added to the loss.
# Verdict: bug, KL005. Every policy log-prob in the KL term is detached, so the
# penalty is a constant for autograd: zero gradient, the regulariser does nothing
# while the logged "kl_penalty" suggests it does.
from typing import Any

import torch
from nemo_rl.algorithms.loss_functions import LossType
from nemo_rl.algorithms.utils import masked_mean


class JudgedSelfPlayLossFn:
    loss_type = LossType.TOKEN_LEVEL

    def __init__(self, cfg: dict[str, Any]):
        self.kl_coef = cfg["reference_policy_kl_penalty"]
        self.eps_low = cfg["ratio_clip_min"]
        self.eps_high = cfg["ratio_clip_max"]
        self.judge_temperature = cfg.get("judge_temperature", 1.0)

    def judge_advantages(self, judge_logits, seat):
        # judge_logits[:, 0] prefers seat 0, judge_logits[:, 1] prefers seat 1
        pref = torch.softmax(judge_logits / self.judge_temperature, dim=-1)
        return pref.gather(1, seat.unsqueeze(1)).squeeze(1) - 0.5

    def __call__(self, curr_logprobs, data, global_valid_toks):
        mask = data["token_mask"] * data["sample_mask"].unsqueeze(-1)
        prev_logprobs = data["prev_logprobs"]
        ref_logprobs = data["reference_policy_logprobs"]
        advantages = self.judge_advantages(data["judge_logits"], data["seat"]).unsqueeze(-1)

        # error: KL005
        kl = torch.exp(ref_logprobs - prev_logprobs) - (ref_logprobs - prev_logprobs) - 1
        kl_penalty = self.kl_coef * masked_mean(kl, mask, global_normalization_factor=global_valid_toks)

        ratios = (curr_logprobs - prev_logprobs).exp()
        clipped = ratios.clamp(1.0 - self.eps_low, 1.0 + self.eps_high)
        loss1 = -advantages * ratios
        loss2 = -advantages * clipped
        actor_loss = masked_mean(torch.max(loss1, loss2), mask, global_normalization_factor=global_valid_toks)

        loss = actor_loss + kl_penalty
        metrics = {
            "loss": loss.item(),
            "actor_loss": actor_loss.item(),
            "kl_penalty": kl_penalty.item(),
            "judge_pref_mean": (advantages.squeeze(-1) + 0.5).mean().item(),
        }
        return loss, metrics
