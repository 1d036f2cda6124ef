# Reviewer: a user's multi-turn GRPO trainer on top of TRL's GRPOTrainer (environment
# feedback inserted between assistant turns, `assistant_mask` = 0 on it). The KL term is
# written as a score function: the detached log-ratio is summed "to go" and multiplies
# the log-probs. The reward-to-go is computed per turn (`turn_ids`): it restarts at the
# first token of every assistant turn, so it stops at the end of the current turn.
# Verdict: BUG (KL003). The weight of a token must include the log-ratios of all later
# assistant tokens of the trajectory, including those of later turns (the environment
# tokens in between are masked, not a barrier). Restarting per turn drops the effect of
# a turn on the next ones: a turn-level partial gradient of KL(pi||pi_ref).
import torch

from trl import GRPOConfig, GRPOTrainer


def reverse_cumsum_per_turn(x, turn_ids, mask):
    num_turns = int(turn_ids.max()) + 1
    out = torch.zeros_like(x)
    for k in range(num_turns):
        seg = (turn_ids == k).to(x.dtype) * mask
        out += torch.flip(torch.cumsum(torch.flip(x * seg, dims=[1]), dim=1), dims=[1]) * seg
    return out


class MultiTurnGRPOTrainer(GRPOTrainer):
    def __init__(self, *args, args_: GRPOConfig = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.beta = 0.04 if args_ is None else args_.beta

    def _multiturn_loss(self, per_token_logps, old_per_token_logps, ref_per_token_logps, advantages, assistant_mask, turn_ids):
        mask = assistant_mask.float()
        coef = torch.exp(per_token_logps - old_per_token_logps)
        per_token_pg = -coef * advantages.unsqueeze(1)
        pg_loss = ((per_token_pg * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()

        log_ratio = (per_token_logps - ref_per_token_logps).detach()
        kl_to_go = reverse_cumsum_per_turn(log_ratio, turn_ids, mask)
        # error: KL003
        kl_term = (kl_to_go * per_token_logps * mask).sum(-1).mean()
        loss = pg_loss + self.beta * kl_term

        self._metrics["train"]["kl"].append((log_ratio * mask).sum(-1).mean().item())
        self._metrics["train"]["assistant_tokens"].append(mask.sum().item())
        return loss

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        logits_to_keep = inputs["completion_ids"].size(1)
        per_token_logps = self._get_per_token_logps(model, input_ids, attention_mask, logits_to_keep)
        old = inputs.get("old_per_token_logps")
        old = per_token_logps.detach() if old is None else old
        return self._multiturn_loss(
            per_token_logps,
            old,
            inputs["ref_per_token_logps"],
            inputs["advantages"],
            inputs["assistant_mask"],
            inputs["turn_ids"],
        )
