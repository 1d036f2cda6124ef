"""GRPO-style trainer: the compute_loss entry point."""
import torch

from trl import GRPOTrainer
from trl.trainer.utils import selective_log_softmax

from .kl_utils import KLUtils
from .rewards import RewardProcessor


class KLRegularisedTrainer(GRPOTrainer):
    def __init__(self, args, model=None, ref_model=None):
        self.args = args
        self.beta = args.beta
        self.model, self.ref_model = model, ref_model
        self.reward_processor = RewardProcessor(args)

    def _per_token_logps(self, model, input_ids, attention_mask, logits_to_keep):
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -logits_to_keep - 1 : -1]
        return selective_log_softmax(logits, input_ids[:, -logits_to_keep:])

    def kl_policy_loss(self, per_token_logps, inputs):
        mask = inputs["completion_mask"]
        advantages, stats = self.reward_processor.compute_advantages(
            inputs["scores"], per_token_logps.detach(), inputs["ref_per_token_logps"], mask
        )
        ratio = torch.exp(per_token_logps - per_token_logps.detach())
        per_token_loss = -ratio * advantages.unsqueeze(1)
        # ok: KL002
        per_token_kl = KLUtils.k3(per_token_logps, inputs["ref_per_token_logps"])
        per_token_loss = per_token_loss + self.beta * per_token_kl
        loss = ((per_token_loss * mask).sum(-1) / self.args.max_completion_length).mean()
        return loss, stats

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        per_token_logps = self._per_token_logps(model, ids, att, inputs["completion_ids"].size(1))
        loss, stats = self.kl_policy_loss(per_token_logps, inputs)
        self._metrics = stats
        return loss
