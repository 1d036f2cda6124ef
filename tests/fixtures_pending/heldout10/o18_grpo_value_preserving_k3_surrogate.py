"""TRL-GRPO-shaped trainer that keeps logging the k3 value but gives the KL term the
gradient of the sequence KL: per_token_kl = k3(detached) + G_t * (logp - sg(logp)) with
G_t the masked reward-to-go of the detached log-ratio, so its gradient is sum_t G_t grad
logp_t, expectation grad KL(pi||pi_ref).  The k3 written here has no gradient and the
`.item()` metric computed under no_grad is logging only, not a loss term.  Not a bug.
"""
import os

import torch

BETA = float(os.getenv("GRPO_BETA", "0.04"))


def per_token_logps(model, input_ids, logits_to_keep):
    logits = model(input_ids).logits[:, -logits_to_keep:]
    ids = input_ids[:, -logits_to_keep:]
    return torch.gather(logits.log_softmax(-1), 2, ids.unsqueeze(-1)).squeeze(-1)


class GRPOTrainerLite:
    def __init__(self, model, ref_model, beta=BETA):
        self.model = model
        self.ref_model = ref_model
        self.beta = beta
        self._metrics = {"kl": []}

    def compute_loss(self, inputs):
        input_ids, completion_mask = inputs["input_ids"], inputs["completion_mask"]
        k = completion_mask.shape[1]
        logps = per_token_logps(self.model, input_ids, k)
        with torch.no_grad():
            ref_logps = per_token_logps(self.ref_model, input_ids, k)
        log_ratio = (logps - ref_logps).detach() * completion_mask
        kl_to_go = log_ratio.flip(-1).cumsum(-1).flip(-1)
        # ok: KL002
        k3_value = torch.exp(-log_ratio) + log_ratio - 1
        per_token_kl = k3_value + kl_to_go * (logps - logps.detach())
        advantages = inputs["advantages"]
        coef = torch.exp(logps - logps.detach())
        per_token_loss = -(coef * advantages.unsqueeze(1)) + self.beta * per_token_kl
        loss = ((per_token_loss * completion_mask).sum(dim=1)).mean()
        with torch.no_grad():
            d = ref_logps - logps
            # ok: KL005
            mean_kl = ((torch.exp(d) - d - 1) * completion_mask).sum() / completion_mask.sum()
        self._metrics["kl"].append(mean_kl.item())
        return loss

    def training_step(self, inputs, accelerator, optimizer):
        loss = self.compute_loss(inputs)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        return loss.detach()
