# Reviewer: this GRPO subclass builds an *objective* (advantage term minus KL) and
# returns its negation as the loss. The sequence-level k2 estimate is fine, but it is
# added to the objective ("KL bonus"), so minimising -objective drives the policy away
# from the reference instead of towards it.
import torch
from trl import GRPOTrainer


class SequenceKLGRPOTrainer(GRPOTrainer):
    """GRPO with a sequence-level KL regulariser (k2 of the summed log-ratio)."""

    def _completion_logps(self, model, input_ids, attention_mask, logits_to_keep):
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        logits = logits[:, -logits_to_keep - 1 : -1, :] / self.temperature
        target = input_ids[:, -logits_to_keep:]
        return torch.gather(logits.log_softmax(-1), 2, target.unsqueeze(-1)).squeeze(-1)

    def sequence_objective(self, per_token_logps, ref_per_token_logps, advantages, completion_mask):
        # importance ratio is 1 in value on fresh rollouts, carries grad logp
        ratio = torch.exp(per_token_logps - per_token_logps.detach())
        lengths = completion_mask.sum(dim=1).clamp(min=1.0)
        pg_objective = (ratio * advantages.unsqueeze(1) * completion_mask).sum(dim=1) / lengths

        seq_log_ratio = ((per_token_logps - ref_per_token_logps) * completion_mask).sum(dim=1)
        # error: KL006
        seq_kl = 0.5 * seq_log_ratio.pow(2)
        # objective = reward-ish term and the KL "bonus" that keeps the policy exploring
        objective = pg_objective + self.beta * seq_kl

        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["kl"].append(seq_log_ratio.mean().item())
        return objective.mean()

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if return_outputs:
            raise ValueError("SequenceKLGRPOTrainer does not support returning outputs")
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        logits_to_keep = completion_ids.size(1)

        per_token_logps = self._completion_logps(model, input_ids, attention_mask, logits_to_keep)
        with torch.no_grad():
            ref_per_token_logps = self._completion_logps(self.ref_model, input_ids, attention_mask, logits_to_keep)

        objective = self.sequence_objective(
            per_token_logps, ref_per_token_logps, inputs["advantages"], completion_mask
        )
        loss = -objective
        return loss
