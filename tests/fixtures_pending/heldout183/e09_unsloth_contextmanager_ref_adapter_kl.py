# Reviewer: unsloth/TRL-style GRPO with a LoRA policy whose reference is the
# same model with its adapter disabled. reference_adapter is a @contextmanager
# that disables the adapter AND enters torch.no_grad() (the reference needs no
# graph). The sequence KL, 0.5 * (sum_t logr_t)^2 (a correct estimator), is
# written inside the `with` block, right after the reference forward, so it is
# computed without autograd and has no gradient path to the policy: the KL term
# in the loss is a constant, zero gradient.
# Verdict: bug, KL005, reported on the line that computes seq_kl inside the block.
from contextlib import contextmanager

import torch

from trl import GRPOConfig
from unsloth import FastLanguageModel  # noqa: F401 (patches the model classes)


def selective_log_softmax(logits, index):
    logps = torch.log_softmax(logits.float(), dim=-1)
    return torch.gather(logps, -1, index.unsqueeze(-1)).squeeze(-1)


@contextmanager
def reference_adapter(model):
    """Run the block as the reference policy: adapter off, no autograd."""
    was_training = model.training
    model.eval()
    try:
        with model.disable_adapter(), torch.no_grad():
            yield model
    finally:
        model.train(was_training)


class UnslothGRPOTrainer:
    def __init__(self, model, args: GRPOConfig, beta: float = 0.04):
        self.model = model
        self.args = args
        self.beta = beta
        self._metrics = {"kl": [], "loss": []}

    def _get_per_token_logps(self, model, input_ids, attention_mask, logits_to_keep):
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        logits = logits[:, -logits_to_keep - 1 : -1]
        return selective_log_softmax(logits, input_ids[:, -logits_to_keep:])

    def compute_loss(self, model, inputs):
        completion_mask = inputs["completion_mask"]
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], completion_mask], dim=1)
        logits_to_keep = completion_mask.size(1)

        per_token_logps = self._get_per_token_logps(model, input_ids, attention_mask, logits_to_keep)
        with reference_adapter(model):
            ref_per_token_logps = self._get_per_token_logps(model, input_ids, attention_mask, logits_to_keep)
            # error: KL005
            seq_kl = 0.5 * (((per_token_logps - ref_per_token_logps) * completion_mask).sum(1)) ** 2

        advantages = inputs["advantages"]
        coef = torch.exp(per_token_logps - per_token_logps.detach())
        pg_loss = -((coef * advantages.unsqueeze(1)) * completion_mask).sum(1)
        loss = (pg_loss + self.beta * seq_kl).mean()

        self._metrics["kl"].append(seq_kl.mean().item())
        self._metrics["loss"].append(loss.item())
        return loss
