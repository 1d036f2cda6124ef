"""LightningModule doing a REINFORCE step with a score-function KL penalty weighted by the KL reward-to-go."""
from dataclasses import dataclass

import lightning as L
import torch

from .kl_utils import gather_logprobs, kl_to_go, masked_token_sum, token_log_ratio


@dataclass
class RLConfig:
    kl_coef: float = 0.05
    lr: float = 1e-6
    kl_estimator: str = "k1"


class PolicyModule(L.LightningModule):
    def __init__(self, policy, ref_policy, cfg: RLConfig = RLConfig()):
        super().__init__()
        self.policy = policy
        self.ref_policy = ref_policy.requires_grad_(False)
        self.cfg = cfg
        self.automatic_optimization = False

    def configure_optimizers(self):
        return torch.optim.AdamW(self.policy.parameters(), lr=self.cfg.lr)

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        mask = batch["completion_mask"]
        logp = gather_logprobs(self.policy(batch["input_ids"]).logits[:, :-1], batch["labels"])
        with torch.no_grad():
            ref_logp = gather_logprobs(self.ref_policy(batch["input_ids"]).logits[:, :-1], batch["labels"])
        log_ratio = token_log_ratio(logp, ref_logp, mask)
        pg_loss = -(batch["advantages"] * masked_token_sum(logp, mask)).mean()
        # ok: KL001,KL003
        kl_loss = masked_token_sum(kl_to_go(log_ratio, mask) * logp, mask).mean()
        loss = pg_loss + self.cfg.kl_coef * kl_loss
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        self.log_dict({"train/kl": masked_token_sum(log_ratio, mask).mean().detach(), "train/loss": loss.detach()})
        return loss.detach()
