# Reviewer: NeMo-RL-style loss function that receives the generation results as
# lists of per-sample tensors (List[torch.Tensor], variable lengths), pads them
# with torch.nn.utils.rnn.pad_sequence, and then loops over samples with each
# sample's own length. The authors moved the KL to the SEQUENCE level ("token
# k3 is biased, take the whole response"): seq_log_ratio = sum_t (logp_t - ref_t)
# and the per-sample penalty is k3 of that sequence log-ratio,
# exp(-x) + x - 1, with gradient. Its gradient is (1 - exp(-x)) * grad log pi(y),
# whose expectation is grad KL(pi_ref||pi) of the sequence: the swapped
# divergence, even though the sum over tokens was taken first.
# Verdict: bug, KL002, reported on the line that computes the sequence k3.
from typing import Any, Dict, List, Tuple

import torch
from torch.nn.utils.rnn import pad_sequence

from nemo_rl.algorithms.interfaces import LossFunction
from nemo_rl.distributed.batched_data_dict import BatchedDataDict


class SequenceKLPolicyLoss:
    def __init__(self, cfg: Dict[str, Any]):
        self.reference_policy_kl_penalty = cfg.get("reference_policy_kl_penalty", 0.05)
        self.ratio_clip = cfg.get("ratio_clip", 0.2)

    def __call__(
        self,
        logprobs: List[torch.Tensor],
        prev_logprobs: List[torch.Tensor],
        reference_logprobs: List[torch.Tensor],
        advantages: torch.Tensor,
    ) -> Tuple[torch.Tensor, Dict[str, float]]:
        lengths = [lp.numel() for lp in logprobs]
        curr = pad_sequence(logprobs, batch_first=True, padding_value=0.0)
        prev = pad_sequence(prev_logprobs, batch_first=True, padding_value=0.0)
        ref = pad_sequence(reference_logprobs, batch_first=True, padding_value=0.0)

        losses = []
        seq_kls = []
        for i, n in enumerate(lengths):
            ratio = torch.exp(curr[i, :n] - prev[i, :n])
            clipped = ratio.clamp(1.0 - self.ratio_clip, 1.0 + self.ratio_clip)
            pg = -torch.min(ratio * advantages[i], clipped * advantages[i]).sum()
            seq_log_ratio = (curr[i, :n] - ref[i, :n]).sum()
            # error: KL002
            seq_kl = torch.exp(-seq_log_ratio) + seq_log_ratio - 1.0
            losses.append(pg + self.reference_policy_kl_penalty * seq_kl)
            seq_kls.append(seq_kl.detach())
        loss = torch.stack(losses).mean()
        metrics = {"loss": loss.item(), "kl_penalty": torch.stack(seq_kls).mean().item()}
        return loss, metrics


def train_step(policy, batch: BatchedDataDict, loss_fn: SequenceKLPolicyLoss, optimizer):
    logprobs = policy.get_logprobs_per_sample(batch["message_log"])
    loss, metrics = loss_fn(
        logprobs,
        batch["generation_logprobs"],
        batch["reference_policy_logprobs"],
        batch["advantages"],
    )
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return metrics
