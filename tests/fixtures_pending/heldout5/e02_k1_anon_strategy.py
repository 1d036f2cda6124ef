"""REINFORCE++-style step with a KL loss, DeepSpeed strategy wrapper."""
import torch


def _lp(model, ids, attn, n):
    out = model(ids, attention_mask=attn).logits[:, -n - 1 : -1]
    return out.log_softmax(-1).gather(-1, ids[:, -n:].unsqueeze(-1)).squeeze(-1)


class ReinforceTrainer:
    def __init__(self, strategy, actor, initial_model, optimizer, beta=0.01):
        self.strategy = strategy
        self.actor = actor
        self.initial_model = initial_model
        self.optimizer = optimizer
        self.beta = beta

    def training_step(self, ids, attn, m, adv):
        n = m.size(1)
        a = _lp(self.actor, ids, attn, n)
        with torch.no_grad():
            b = _lp(self.initial_model, ids, attn, n)
        pg = -(adv.unsqueeze(-1) * a * m).sum(-1).mean()
        # error: KL001
        d = a - b
        kl = (d * m).sum(-1) / m.sum(-1)
        loss = pg + self.beta * kl.mean()
        self.strategy.backward(loss, self.actor, self.optimizer)
        self.strategy.optimizer_step(self.optimizer, self.actor)
        return {"loss": loss.item(), "kl": kl.mean().item()}
