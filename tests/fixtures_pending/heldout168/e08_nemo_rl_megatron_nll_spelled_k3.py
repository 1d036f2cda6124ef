# Reviewer: NeMo-RL-style ClippedPGLossFn for the Megatron policy worker. Token
# log-probs come as NEGATIVE LOG-LIKELIHOODS from a vocab-parallel cross-entropy
# (log-sum-exp and target logit all-reduced over the TP group with the
# differentiable torch.distributed.nn all_reduce); the reference and previous
# log-probs in the batch are negated into NLLs too. The KL penalty
# `exp(nll - ref_nll) - (nll - ref_nll) - 1` is k3 (nll - ref_nll = ref - logp)
# with its gradient, summed over tokens and divided by the global number of valid
# sequences (all-reduced by the caller). Expected gradient: the token-level
# gradient of KL(pi_ref||pi).
# Verdict: bug, KL002, reported on the `kl = torch.exp(nll - ref_nll) - ...` line.
import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn

from megatron.core.parallel_state import get_tensor_model_parallel_group
from nemo_rl.algorithms.interfaces import LossFunction


def vocab_parallel_cross_entropy(vocab_parallel_logits, target, tp_group=None):
    with torch.no_grad():
        logits_max = vocab_parallel_logits.max(dim=-1, keepdim=True).values
        dist.all_reduce(logits_max, op=dist.ReduceOp.MAX, group=tp_group)
    logits = vocab_parallel_logits - logits_max
    lse = dist_fn.all_reduce(logits.exp().sum(-1), group=tp_group).log()
    part = logits.shape[-1]
    start = dist.get_rank(group=tp_group) * part
    hit = (target >= start) & (target < start + part)
    idx = torch.where(hit, target - start, torch.zeros_like(target))
    tgt = dist_fn.all_reduce(logits.gather(-1, idx.unsqueeze(-1)).squeeze(-1) * hit, group=tp_group)
    return lse - tgt


class ClippedPGLossFn(LossFunction):
    def __init__(self, cfg):
        self.reference_policy_kl_penalty = cfg["reference_policy_kl_penalty"]
        self.ratio_clip_min = cfg["ratio_clip_min"]
        self.ratio_clip_max = cfg["ratio_clip_max"]
        self.tp_group = None

    def __call__(self, next_token_logits, data, global_valid_seqs, global_valid_toks):
        token_mask = data["token_mask"][:, 1:]
        sample_mask = data["sample_mask"]
        mask = token_mask * sample_mask.unsqueeze(-1)
        targets = data["input_ids"][:, 1:]
        nll = vocab_parallel_cross_entropy(next_token_logits[:, :-1], targets, self.tp_group)
        old_nll = -data["prev_logprobs"][:, 1:]
        ref_nll = -data["reference_policy_logprobs"][:, 1:]

        ratio = torch.exp(old_nll - nll)
        adv = data["advantages"][:, 1:]
        clipped = ratio.clamp(1 - self.ratio_clip_min, 1 + self.ratio_clip_max)
        pg = -torch.min(ratio * adv, clipped * adv)
        # error: KL002
        kl = torch.exp(nll - ref_nll) - (nll - ref_nll) - 1
        per_token = pg + self.reference_policy_kl_penalty * kl
        loss = (per_token * mask).sum() / global_valid_seqs

        with torch.no_grad():
            probs_ratio = (ratio * mask).sum() / global_valid_toks
            kl_metric = (kl * mask).sum() / global_valid_toks
        return loss, {"loss": loss.item(), "probs_ratio": probs_ratio.item(), "kl_penalty": kl_metric.item()}


DEFAULT_LOSS_CFG = {"reference_policy_kl_penalty": 0.01, "ratio_clip_min": 0.2, "ratio_clip_max": 0.2}


def count_global_valid(data, dp_group=None):
    counts = torch.stack([data["sample_mask"].sum(), (data["token_mask"][:, 1:] * data["sample_mask"].unsqueeze(-1)).sum()]).double()
    dist.all_reduce(counts, group=dp_group)
    return counts[0], counts[1]
