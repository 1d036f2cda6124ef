"""Sequence-level k2 KL loss, Accelerate trainer."""
import torch


def completion_logps(model, input_ids, attention_mask, completion_ids):
    logits = model(input_ids, attention_mask=attention_mask).logits[:, -completion_ids.size(1) - 1 : -1]
    return torch.gather(logits.log_softmax(-1), 2, completion_ids.unsqueeze(-1)).squeeze(-1)


class SeqKLTrainer:
    def __init__(self, model, ref_model, accelerator, optimizer, beta=0.05):
        self.model = model
        self.ref_model = ref_model
        self.accelerator = accelerator
        self.optimizer = optimizer
        self.beta = beta

    def compute_loss(self, inputs):
        lp = completion_logps(self.model, inputs["input_ids"], inputs["attention_mask"], inputs["completion_ids"])
        with torch.no_grad():
            lq = completion_logps(self.ref_model, inputs["input_ids"], inputs["attention_mask"], inputs["completion_ids"])
        m = inputs["completion_mask"]
        pg_loss = -(inputs["advantages"] * (lp * m).sum(1)).mean()
        # ok: KL001
        seq_log_ratio = ((lp - lq) * m).sum(dim=1)
        # ok: KL003
        kl = 0.5 * seq_log_ratio.pow(2)
        return pg_loss + self.beta * kl.mean()

    def training_step(self, inputs):
        loss = self.compute_loss(inputs)
        self.accelerator.backward(loss)
        self.optimizer.step()
        self.optimizer.zero_grad()
        return loss.detach()
