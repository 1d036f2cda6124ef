"""TRL-style trainer with accelerator.backward: sequence k2 turned into a Python float with .item() before it joins the loss."""
import torch
from accelerate import Accelerator


def selective_log_softmax(logits, index):
    logsumexp = torch.logsumexp(logits, dim=-1)
    return torch.gather(logits, -1, index.unsqueeze(-1)).squeeze(-1) - logsumexp


class OnlineDPOLikeTrainer:
    def __init__(self, model, ref_model, optimizer, beta=0.05):
        self.accelerator = Accelerator(gradient_accumulation_steps=4)
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.ref_model = ref_model
        self.beta = beta
        self.stats = {"kl": [], "loss": []}

    def _logps(self, model, input_ids, attention_mask, completion_ids):
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        logits = logits[:, -completion_ids.size(1) - 1 : -1] / 0.9
        return selective_log_softmax(logits, completion_ids)

    def training_step(self, inputs):
        logps = self._logps(self.model, inputs["input_ids"], inputs["attention_mask"], inputs["completion_ids"])
        with torch.no_grad():
            ref_logps = self._logps(
                self.ref_model, inputs["input_ids"], inputs["attention_mask"], inputs["completion_ids"]
            )
        mask = inputs["completion_mask"]
        seq_logps = (logps * mask).sum(1)
        advantages = inputs["rewards"] - inputs["rewards"].mean()
        pg_loss = -(advantages * seq_logps).mean()
        seq_log_ratio = ((logps - ref_logps) * mask).sum(1)
        # error: KL005
        kl = (0.5 * seq_log_ratio**2).mean().item()
        loss = pg_loss + self.beta * kl
        with self.accelerator.accumulate(self.model):
            self.accelerator.backward(loss)
            self.optimizer.step()
            self.optimizer.zero_grad()
        self.stats["kl"].append(kl)
        self.stats["loss"].append(loss.item())
        return loss.detach()
