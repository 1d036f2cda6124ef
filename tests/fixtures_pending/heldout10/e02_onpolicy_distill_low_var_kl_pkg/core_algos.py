"""Helpers copied in the spirit of verl's core_algos."""
import torch


def kl_penalty(logprob: torch.FloatTensor, ref_logprob: torch.FloatTensor, kl_penalty: str) -> torch.FloatTensor:
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty == "abs":
        return (logprob - ref_logprob).abs()
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        kl = ref_logprob - logprob
        kl = torch.clamp(kl, min=-20, max=20)
        ratio = torch.exp(kl)
        kld = (ratio - kl - 1).contiguous()
        return torch.clamp(kld, min=-10, max=10)
    raise NotImplementedError(kl_penalty)


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str):
    if loss_agg_mode == "token-mean":
        return (loss_mat * loss_mask).sum() / loss_mask.sum().clamp(min=1)
    if loss_agg_mode == "seq-mean-token-sum":
        return (loss_mat * loss_mask).sum(-1).mean()
    raise ValueError(loss_agg_mode)


def logprobs_from_logits(logits, labels, temperature=1.0):
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return torch.gather(logp, -1, labels.unsqueeze(-1)).squeeze(-1)
