"""A Lightning-style GRPO module whose KL helper is `torch.compile`d: per-token k2
0.5 * (logp - ref)^2 is averaged over time with `masked_mean` and then summed over the
batch.  Each token's gradient is x_t grad logp_t (times 1/|y|), the token-level partial
gradient of the sequence KL(pi||pi_ref): the credit a token should get for the KL of the
tokens it leads to is missing (KL003, reported at the call of the compiled helper).
"""
import torch


@torch.compile(dynamic=True)
def _squared_log_ratio(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return 0.5 * (logp - ref_logp).square()


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    if dim is None:
        return (values * mask).sum() / mask.sum()
    return (values * mask).sum(dim) / mask.sum(dim).clamp(min=1.0)


class GRPOModule:  # would subclass lightning.LightningModule
    automatic_optimization = False

    def __init__(self, policy, ref_policy, beta: float = 0.02, num_generations: int = 4):
        self.policy = policy
        self.ref_policy = ref_policy
        self.beta = beta
        self.num_generations = num_generations

    def _logps(self, model, ids):
        logits = model(ids).logits
        return logits.log_softmax(-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)

    def compute_loss(self, ids, completion_mask, advantages):
        logp = self._logps(self.policy, ids)
        with torch.inference_mode():
            ref_logp = self._logps(self.ref_policy, ids)
        ref_logp = ref_logp.clone()
        pg_per_seq = masked_mean(-advantages[:, None] * logp, completion_mask, dim=-1)
        # error: KL003
        kl_per_seq = masked_mean(_squared_log_ratio(logp, ref_logp), completion_mask, dim=-1)
        return pg_per_seq.sum() + self.beta * kl_per_seq.sum(), kl_per_seq.detach().mean()

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        loss, kl = self.compute_loss(batch["ids"], batch["completion_mask"], batch["advantages"])
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        self.log("train/kl", kl)
        return loss
