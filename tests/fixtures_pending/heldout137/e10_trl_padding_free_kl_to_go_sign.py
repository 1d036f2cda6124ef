# Reviewer: TRL-style GRPO trainer with padding_free=True: completions are
# flattened into one [1, total] row and position_ids restart at 0 at every
# sequence; segment ids come from those resets. The KL term is the cumulative
# score-function estimator, kl_to_go (reverse cumulative sum inside each
# segment) times the log-probs, but its weight is built from
# log(pi_ref / pi) = ref - logp, the NEGATED log-ratio. The reward-to-go is
# right, the sign is not: kl_penalty has expected gradient
# -grad KL(pi||pi_ref), and adding it to the minimised loss pushes away from
# the reference.
# Verdict: bug, KL006, reported on the kl_penalty line (detached weight times logps).
import torch
from transformers import Trainer
from trl import GRPOConfig, GRPOTrainer


def segment_ids_from_position_ids(position_ids: torch.Tensor) -> torch.Tensor:
    return (position_ids == 0).long().cumsum(0) - 1


def segment_reverse_cumsum(x: torch.Tensor, seg_ids: torch.Tensor) -> torch.Tensor:
    n = int(seg_ids.max()) + 1
    totals = x.new_zeros(n).index_add(0, seg_ids, x)
    earlier = totals.cumsum(0) - totals
    within = x.cumsum(0) - earlier[seg_ids]
    return totals[seg_ids] - within + x


def padding_free_grpo_loss(per_token_logps, old_per_token_logps, ref_per_token_logps, advantages,
                           completion_mask, position_ids, beta=0.04, epsilon=0.2):
    seg_ids = segment_ids_from_position_ids(position_ids)
    num_seqs = int(seg_ids.max()) + 1
    coef = torch.exp(per_token_logps - old_per_token_logps)
    pg = -torch.min(coef * advantages, coef.clamp(1 - epsilon, 1 + epsilon) * advantages)
    pg_loss = (pg * completion_mask).sum() / num_seqs

    ref_log_ratio = (ref_per_token_logps - per_token_logps).detach() * completion_mask
    kl_to_go = segment_reverse_cumsum(ref_log_ratio, seg_ids)
    # error: KL006
    kl_penalty = (kl_to_go * per_token_logps * completion_mask).sum() / num_seqs
    loss = pg_loss + beta * kl_penalty
    return loss, {"kl": (-ref_log_ratio.sum() / num_seqs).item()}


class PaddingFreeGRPOTrainer(GRPOTrainer):
    def __init__(self, *args, args_cfg: GRPOConfig = None, **kwargs):
        self.beta = 0.04
        self.epsilon = 0.2
        self._metrics = {"train": {}}

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        input_ids = inputs["input_ids"]
        position_ids = inputs["position_ids"]
        logits = model(input_ids=input_ids, position_ids=position_ids).logits[0, :-1]
        per_token_logps = torch.gather(logits.log_softmax(-1), 1, input_ids[0, 1:].unsqueeze(-1)).squeeze(-1)
        loss, metrics = padding_free_grpo_loss(
            per_token_logps,
            inputs["old_per_token_logps"],
            inputs["ref_per_token_logps"],
            inputs["advantages"],
            inputs["completion_mask"],
            position_ids[0, 1:],
            beta=self.beta,
            epsilon=self.epsilon,
        )
        self._metrics["train"].setdefault("kl", []).append(metrics["kl"])
        return loss
