"""Policy loss as nn.Modules held on the trainer, AMP GradScaler (NeMo-RL-like)."""
import torch
import torch.nn as nn


def masked_mean(x, mask, dim=None):
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)


class ReferenceKLLoss(nn.Module):
    def __init__(self, coef=0.05):
        super().__init__()
        self.coef = coef

    def forward(self, logps, ref_logps, mask):
        # error: KL002
        per_tok = torch.expm1(ref_logps - logps) - (ref_logps - logps)
        return self.coef * masked_mean(per_tok, mask)


class ClippedPGLoss(nn.Module):
    def __init__(self, eps=0.2):
        super().__init__()
        self.eps = eps

    def forward(self, logps, old_logps, adv, mask):
        r = (logps - old_logps).exp()
        return masked_mean(-torch.min(r * adv, r.clamp(1 - self.eps, 1 + self.eps) * adv), mask)


class PolicyTrainer:
    def __init__(self, policy, reference, optimizer, scaler):
        self.policy = policy
        self.reference = reference
        self.optimizer = optimizer
        self.scaler = scaler
        self.pg_loss_fn = ClippedPGLoss()
        self.kl_loss_fn = ReferenceKLLoss(coef=0.05)

    def _logps(self, model, input_ids, labels):
        logits = model(input_ids).logits[:, :-1]
        return logits.log_softmax(-1).gather(-1, labels[:, 1:].unsqueeze(-1)).squeeze(-1)

    def train_step(self, batch):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logps = self._logps(self.policy, batch["input_ids"], batch["input_ids"])
            with torch.no_grad():
                ref_logps = self._logps(self.reference, batch["input_ids"], batch["input_ids"])
            mask = batch["loss_mask"][:, 1:]
            loss = self.pg_loss_fn(logps, batch["old_logps"], batch["advantages"].unsqueeze(-1), mask)
            loss = loss + self.kl_loss_fn(logps, ref_logps, mask)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
