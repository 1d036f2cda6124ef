"""PyTorch Lightning module for PPO-style RLHF that works with token probabilities.

What it shows: the policy's and the reference's probabilities of the sampled response tokens
are gathered from `softmax`, and the KL penalty is `log(pi_tok / ref_tok)`, i.e. the k1 estimate
log pi(y_t) - log pi_ref(y_t), summed over the response and returned as part of the loss that
Lightning backpropagates. Its autograd gradient is grad log pi(y_t), with expectation zero under
y ~ pi: the regulariser has zero expected gradient and only adds noise (KL001).
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


class PPOLitModule(pl.LightningModule):
    def __init__(self, policy, reference, lr: float = 1e-6, kl_coef: float = 0.05, clip_range: float = 0.2):
        super().__init__()
        self.policy = policy
        self.reference = reference.eval().requires_grad_(False)
        self.lr = lr
        self.kl_coef = kl_coef
        self.clip_range = clip_range

    @staticmethod
    def token_probs(model, input_ids, attention_mask, response_ids) -> torch.Tensor:
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        logits = logits[:, -response_ids.size(1) - 1 : -1].float()
        return logits.softmax(-1).gather(-1, response_ids.unsqueeze(-1)).squeeze(-1)

    def compute_loss(self, pi_tok, ref_tok, batch) -> tuple[torch.Tensor, dict]:
        mask = batch["response_mask"].float()
        adv = batch["advantages"]
        ratio = pi_tok / batch["behaviour_probs"].clamp_min(1e-12)
        surr1 = ratio * adv
        surr2 = ratio.clamp(1.0 - self.clip_range, 1.0 + self.clip_range) * adv
        pg_loss = masked_mean(-torch.min(surr1, surr2), mask)

        # error: KL001
        kl = torch.log(pi_tok / ref_tok.clamp_min(1e-12))
        kl_seq = (kl * mask).sum(-1)
        loss = pg_loss + self.kl_coef * kl_seq.mean()
        logs = {"train/pg_loss": pg_loss.detach(), "train/kl": kl_seq.detach().mean()}
        return loss, logs

    def training_step(self, batch, batch_idx):
        pi_tok = self.token_probs(self.policy, batch["input_ids"], batch["attention_mask"], batch["response_ids"])
        with torch.no_grad():
            ref_tok = self.token_probs(self.reference, batch["input_ids"], batch["attention_mask"], batch["response_ids"])
        loss, logs = self.compute_loss(pi_tok, ref_tok, batch)
        self.log_dict(logs, prog_bar=True, on_step=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.policy.parameters(), lr=self.lr, weight_decay=0.0)
