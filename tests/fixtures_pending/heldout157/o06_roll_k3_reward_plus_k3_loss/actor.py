# Part of o06 (see __init__.py). Policy update on the returns.
import torch

from roll.models.model_providers import default_actor_model_provider

from . import kl as kl_utils


class ActorWorker:
    def __init__(self, pipeline_config, model=None, optimizer=None):
        self.cfg = pipeline_config
        self.model = model
        self.optimizer = optimizer

    def loss_func(self, log_probs, old_log_probs, ref_log_probs, advantages, response_mask):
        ratio = torch.exp(log_probs - old_log_probs)
        clipped = ratio.clamp(1 - self.cfg.pg_clip, 1 + self.cfg.pg_clip)
        pg_loss = -torch.min(ratio * advantages, clipped * advantages)
        loss = (pg_loss * response_mask).sum(-1).mean()
        if self.cfg.use_kl_loss:
            # ok: KL002
            kl = kl_utils.compute_approx_kl(log_probs, ref_log_probs, kl_estimator=self.cfg.kl_estimator)
            loss = loss + self.cfg.kl_loss_coef * (kl * response_mask).sum(-1).mean()
        return loss

    def compute_log_probs(self, input_ids, attention_mask, response_len):
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask).logits
        logits = logits[:, -response_len - 1 : -1]
        labels = input_ids[:, -response_len:]
        return torch.gather(logits.log_softmax(-1), -1, labels.unsqueeze(-1)).squeeze(-1)

    def train_step(self, batch, advantages):
        response_mask = batch["response_mask"]
        log_probs = self.compute_log_probs(batch["input_ids"], batch["attention_mask"], response_mask.size(1))
        loss = self.loss_func(log_probs, batch["old_log_probs"], batch["ref_log_probs"], advantages, response_mask)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return {"actor/pg_loss": loss.item()}
