# Reviewer: a slime-style policy loss. The names are historical: `log_probs`
# is built here from the floats the rollout engine (SGLang) returned with
# each sample, `torch.tensor(sample.rollout_log_probs)`, so it carries no
# gradient; `old_log_probs` is the training engine's fresh forward of the
# current policy, the only tensor with a gradient. The ratio
# exp(old_log_probs - log_probs) is therefore pi / pi_rollout and is fine, but
# the KL loss is the k3 estimate built from `log_probs` and the reference's
# log-probs (also floats from the rollout): a constant for autograd. The KL
# term has zero gradient whatever kl_loss_coef is (KL005), reported on the k3
# line.
from dataclasses import dataclass
from typing import List

import torch
from torch.nn.utils.rnn import pad_sequence


@dataclass
class Sample:
    tokens: List[int]
    response_length: int
    rollout_log_probs: List[float]
    ref_log_probs: List[float]
    advantage: float = 0.0


def _pad(rows, device):
    return pad_sequence([torch.tensor(r, dtype=torch.float32, device=device) for r in rows], batch_first=True)


def response_logps(logits, tokens, response_lengths):
    """logits [B, L, V] of the training engine, per-token log-probs of each response."""
    lp = torch.gather(logits[:, :-1].log_softmax(-1), -1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1)
    rows = [lp[i, tokens.size(1) - 1 - n :] for i, n in enumerate(response_lengths)]
    return pad_sequence(rows, batch_first=True)


def policy_loss_function(args, samples: List[Sample], logits, tokens):
    device = logits.device
    lengths = [s.response_length for s in samples]
    mask = pad_sequence([torch.ones(n, device=device) for n in lengths], batch_first=True)

    old_log_probs = response_logps(logits, tokens, lengths)
    log_probs = _pad([s.rollout_log_probs for s in samples], device)
    ref_log_probs = _pad([s.ref_log_probs for s in samples], device)
    advantages = torch.tensor([s.advantage for s in samples], device=device).unsqueeze(-1)

    ppo_kl = log_probs - old_log_probs
    ratio = (-ppo_kl).exp()
    pg_losses = -torch.min(ratio * advantages, ratio.clamp(1 - args.eps_clip, 1 + args.eps_clip_high) * advantages)
    pg_loss = ((pg_losses * mask).sum(-1)).mean()

    loss = pg_loss
    metrics = {"pg_loss": pg_loss.detach(), "ppo_kl": ((ppo_kl * mask).sum() / mask.sum()).detach()}
    if args.use_kl_loss:
        # error: KL005
        kl = torch.exp(ref_log_probs - log_probs) - (ref_log_probs - log_probs) - 1
        kl_loss = (kl * mask).sum(-1).mean()
        loss = loss + args.kl_loss_coef * kl_loss
        metrics["kl_loss"] = kl_loss.detach()
    return loss, metrics
