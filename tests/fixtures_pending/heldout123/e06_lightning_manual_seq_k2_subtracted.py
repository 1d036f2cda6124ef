# Reviewer: a Lightning module with manual optimisation for on-policy
# REINFORCE with a KL regulariser. `training_step` accumulates gradients over
# micro-batches with `self.manual_backward`, clips, and steps the optimiser on
# the last one. The KL term is k2 of the *sequence* log-ratio (the log-ratio
# summed over the response, then squared), which has the right gradient.
# Verdict: bug (KL006). The penalty joins the minimised loss with a minus sign
# (`pg_loss - kl_coef * kl_penalty`), written as if the loss were an objective:
# gradient descent pushes the policy away from the reference.
import lightning.pytorch as pl
import torch


class ReinforceKLModule(pl.LightningModule):
    def __init__(self, policy, ref_policy, kl_coef=0.02, num_micro_batches=2, lr=5e-7, max_grad_norm=1.0):
        super().__init__()
        self.policy = policy
        self.ref_policy = ref_policy.requires_grad_(False)
        self.kl_coef = kl_coef
        self.num_micro_batches = num_micro_batches
        self.lr = lr
        self.max_grad_norm = max_grad_norm
        self.automatic_optimization = False

    def _response_logps(self, model, input_ids, attention_mask, response_mask):
        T = response_mask.size(1)
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -T - 1 : -1]
        logps = torch.gather(logits.log_softmax(-1), 2, input_ids[:, -T:].unsqueeze(-1)).squeeze(-1)
        return logps * response_mask

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        opt.zero_grad()
        chunks = [torch.chunk(batch[k], self.num_micro_batches) for k in ("input_ids", "attention_mask", "response_mask", "advantages")]
        kl_values = []
        for input_ids, attention_mask, response_mask, advantages in zip(*chunks):
            logps = self._response_logps(self.policy, input_ids, attention_mask, response_mask)
            with torch.no_grad():
                ref_logps = self._response_logps(self.ref_policy, input_ids, attention_mask, response_mask)

            pg_loss = -(advantages * logps.sum(-1)).mean()
            # error: KL006
            kl_penalty = 0.5 * ((logps - ref_logps).sum(-1) ** 2).mean()
            loss = pg_loss - self.kl_coef * kl_penalty
            self.manual_backward(loss / self.num_micro_batches)
            kl_values.append((logps - ref_logps).sum(-1).detach())

        self.clip_gradients(opt, gradient_clip_val=self.max_grad_norm, gradient_clip_algorithm="norm")
        opt.step()
        self.log("train/seq_kl", torch.cat(kl_values).mean(), prog_bar=True)
        self.log("train/kl_penalty", kl_penalty.detach())

    def configure_optimizers(self):
        return torch.optim.AdamW(self.policy.parameters(), lr=self.lr)
