"""GRPO without a KL loss: k3 is computed under no_grad and only logged (AMP scaler)."""
import torch


def token_logprobs(model, ids, n):
    logits = model(ids).logits[:, -n - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[:, -n:].unsqueeze(-1)).squeeze(-1)


class NoKLTrainer:
    def __init__(self, model, ref_model, optimizer, scaler, logger):
        self.model = model
        self.ref_model = ref_model
        self.optimizer = optimizer
        self.scaler = scaler
        self.logger = logger

    def step(self, ids, mask, advantages, old_logps):
        n = mask.size(1)
        logps = token_logprobs(self.model, ids, n)
        ratio = torch.exp(logps - old_logps)
        pg = -torch.min(ratio * advantages[:, None], ratio.clamp(0.8, 1.28) * advantages[:, None])
        loss = (pg * mask).sum() / mask.sum()
        with torch.no_grad():
            ref_logps = token_logprobs(self.ref_model, ids, n)
            # ok: KL002, KL005
            k3 = torch.exp(ref_logps - logps) - (ref_logps - logps) - 1
            mean_kl = ((k3 * mask).sum(-1) / mask.sum(-1)).mean()
        self.optimizer.zero_grad()
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.logger.log({"loss": loss.item(), "kl": mean_kl.item()})
