# Reviewer: TRL GRPOTrainer-style compute_loss with padding_free=True. The
# completions of the batch are flattened into one row [1, nnz]; sequence
# boundaries are recovered from position_ids (a new sequence starts where
# position_ids == 0), and the "dr_grpo" reduction sums each sequence's tokens
# with scatter_add_ and divides by the constant max_completion_length. The
# per-token KL is GRPO's k3, exp(ref - logp) - (ref - logp) - 1, with its
# gradient through per_token_logps: summed over tokens its expected gradient
# is the token-level gradient of KL(pi_ref||pi).
# Verdict: bug, KL002, reported on the line `per_token_kl = torch.exp(...) - ... - 1`.
from dataclasses import dataclass

import torch

from trl import GRPOConfig  # noqa: F401
from trl.trainer.utils import selective_log_softmax  # noqa: F401


@dataclass
class PaddingFreeGRPOArgs:
    beta: float = 0.04
    epsilon: float = 0.2
    epsilon_high: float = 0.28
    max_completion_length: int = 1
    loss_type: str = "dr_grpo"


def sequence_index_from_position_ids(position_ids: torch.Tensor) -> torch.Tensor:
    starts = (position_ids == 0).long()
    return starts.cumsum(-1) - 1


class PaddingFreeGRPOLoss:
    def __init__(self, args: PaddingFreeGRPOArgs):
        self.args = args

    def compute_loss(self, inputs):
        args = self.args
        per_token_logps = inputs["per_token_logps"]  # [1, nnz], requires grad
        ref_per_token_logps = inputs["ref_per_token_logps"]
        old_per_token_logps = inputs["old_per_token_logps"]
        completion_mask = inputs["completion_mask"]  # [1, nnz]
        seq_idx = sequence_index_from_position_ids(inputs["position_ids"]).squeeze(0)
        num_seqs = int(seq_idx.max()) + 1
        advantages = inputs["advantages"][seq_idx].unsqueeze(0)

        # error: KL002
        per_token_kl = torch.exp(ref_per_token_logps - per_token_logps) - (ref_per_token_logps - per_token_logps) - 1

        coef_1 = torch.exp(per_token_logps - old_per_token_logps)
        coef_2 = torch.clamp(coef_1, 1 - args.epsilon, 1 + args.epsilon_high)
        per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
        per_token_loss = per_token_loss + args.beta * per_token_kl
        per_token_loss = (per_token_loss * completion_mask).squeeze(0)

        per_seq = per_token_loss.new_zeros(num_seqs).scatter_add_(0, seq_idx, per_token_loss)
        loss = per_seq.sum() / (num_seqs * args.max_completion_length)
        mean_kl = (per_token_kl * completion_mask).sum() / completion_mask.sum()
        return loss, {"kl": mean_kl.item()}
