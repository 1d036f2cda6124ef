"""Score-function KL penalty reduced with ``einsum`` per token (bug: KL003).

The penalty weights each token's log-prob by its own detached log-ratio to the
SFT policy, sum_t sg(logp_t - sft_logp_t) * logp_t, fused with the mask in an
einsum. For one token that is the score-function gradient of KL(pi||pi_ref);
for a sampled sequence it keeps only the s = t terms of
grad KL = E[sum_t grad logp_t * sum_{s>=t} logr_s]: a partial gradient. The
fix weights logp_t by the reward-to-go of the log-ratio instead.
"""

from dataclasses import dataclass

import torch


@dataclass
class ScoreFnKLConfig:
    kl_coef: float = 0.05
    whiten_advantages: bool = True


def whiten(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return (x - x.mean()) / (x.std() + eps)


class ScoreFunctionKLLoss(torch.nn.Module):
    def __init__(self, cfg: ScoreFnKLConfig):
        super().__init__()
        self.cfg = cfg

    def forward(self, logp: torch.Tensor, sft_logp: torch.Tensor, seq_rewards: torch.Tensor, mask: torch.Tensor):
        mask = mask.to(logp.dtype)
        adv = whiten(seq_rewards) if self.cfg.whiten_advantages else seq_rewards
        seq_logp = torch.einsum("bt,bt->b", logp, mask)
        pg_loss = -(adv.detach() * seq_logp).mean()

        kl_weight = (logp - sft_logp).detach()
        # error: KL003
        kl_surrogate = torch.einsum("bt,bt,bt->b", kl_weight, logp, mask)
        kl_loss = kl_surrogate.mean()

        with torch.no_grad():
            kl_value = torch.einsum("bt,bt->b", kl_weight, mask).mean()
        return pg_loss + self.cfg.kl_coef * kl_loss, {"kl": kl_value, "pg_loss": pg_loss.detach()}


def update(policy, sft_policy, optimizer, batch, loss_fn: ScoreFunctionKLLoss):
    logp = policy.token_logps(batch.tokens, batch.response_start)
    with torch.inference_mode():
        sft_logp = sft_policy.token_logps(batch.tokens, batch.response_start)
    loss, stats = loss_fn(logp, sft_logp.clone(), batch.rewards, batch.response_mask)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return stats
