"""Offline DPO (sigmoid / cDPO loss) as a ``Trainer.compute_loss`` override.

Besides the implicit rewards it logs a "kl" metric: the mean log-ratio of the
chosen responses to the reference, clamped at 0 as KTO does for its
reference point. The preference pairs come from a fixed dataset.
"""

from collections import defaultdict

import torch
import torch.nn.functional as F
from transformers import Trainer


class DPOTrainerWithKLMetric(Trainer):
    def __init__(self, model, ref_model, beta=0.1, label_smoothing=0.0, label_pad_token_id=-100, **kwargs):
        super().__init__(model=model, **kwargs)
        self.ref_model = ref_model
        self.beta = beta
        self.label_smoothing = label_smoothing
        self.label_pad_token_id = label_pad_token_id
        self._stored_metrics = defaultdict(lambda: defaultdict(list))

    def get_batch_logps(self, logits, labels):
        labels = labels[:, 1:].clone()
        logits = logits[:, :-1, :]
        loss_mask = labels != self.label_pad_token_id
        labels[labels == self.label_pad_token_id] = 0
        per_token_logps = torch.gather(logits.log_softmax(-1), dim=2, index=labels.unsqueeze(2)).squeeze(2)
        return (per_token_logps * loss_mask).sum(-1)

    def concatenated_forward(self, model, batch):
        input_ids = torch.cat([batch["chosen_input_ids"], batch["rejected_input_ids"]], dim=0)
        attention_mask = torch.cat([batch["chosen_attention_mask"], batch["rejected_attention_mask"]], dim=0)
        labels = torch.cat([batch["chosen_labels"], batch["rejected_labels"]], dim=0)
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        all_logps = self.get_batch_logps(logits, labels)
        n_chosen = batch["chosen_input_ids"].shape[0]
        return all_logps[:n_chosen], all_logps[n_chosen:]

    def store_metrics(self, metrics, train_eval="train"):
        for key, value in metrics.items():
            self._stored_metrics[train_eval][key].append(value)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        policy_chosen_logps, policy_rejected_logps = self.concatenated_forward(model, inputs)
        with torch.no_grad():
            reference_chosen_logps, reference_rejected_logps = self.concatenated_forward(self.ref_model, inputs)

        # ok: KL001
        chosen_logratios = policy_chosen_logps - reference_chosen_logps
        rejected_logratios = policy_rejected_logps - reference_rejected_logps
        logits = chosen_logratios - rejected_logratios
        losses = (
            -F.logsigmoid(self.beta * logits) * (1 - self.label_smoothing)
            - F.logsigmoid(-self.beta * logits) * self.label_smoothing
        )
        chosen_rewards = self.beta * chosen_logratios.detach()
        rejected_rewards = self.beta * rejected_logratios.detach()

        # ok: KL005
        kl = (policy_chosen_logps - reference_chosen_logps).detach().mean().clamp(min=0)

        metrics = {
            "rewards/chosen": chosen_rewards.mean().item(),
            "rewards/rejected": rejected_rewards.mean().item(),
            "rewards/accuracies": (chosen_rewards > rejected_rewards).float().mean().item(),
            "rewards/margins": (chosen_rewards - rejected_rewards).mean().item(),
            "kl": kl.item(),
            "logps/chosen": policy_chosen_logps.detach().mean().item(),
        }
        self.store_metrics(metrics)

        loss = losses.mean()
        if return_outputs:
            return loss, metrics
        return loss
