# Reviewer: TRL-style RLOO/GRPO trainer with a sequence-level KL loss. Lengths
# come out of torch with .tolist(), each sample's KL is a 0-d tensor built in a
# Python loop, the batch KL is Python's built-in sum() over that list (which
# adds tensors with autograd, it does not turn them into floats), and only the
# logged value goes through .item() and statistics.mean. The per-sample term is
# the sequence log-ratio sum_t (logp_t - ref_t) itself, i.e. k1 of the sequence
# with its gradient: autograd gives sum_t grad logp_t, whose expectation under
# y ~ pi is zero. The KL term does not regularise.
# Verdict: bug, KL001, reported where the sequence log-ratio is computed in the loop.
import statistics
from collections import defaultdict
from dataclasses import dataclass

import torch

from transformers import PreTrainedModel
from trl.trainer.utils import selective_log_softmax


@dataclass
class SeqKLConfig:
    beta: float = 0.05
    num_generations: int = 4
    max_completion_length: int = 256
    epsilon: float = 0.2


class SequenceKLTrainer:
    def __init__(self, args: SeqKLConfig, model: PreTrainedModel = None, ref_model=None):
        self.args = args
        self.beta = args.beta
        self.model = model
        self.ref_model = ref_model
        self._metrics = defaultdict(list)

    def _get_per_token_logps(self, model, input_ids, attention_mask, logits_to_keep):
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]
        logits = logits[:, -logits_to_keep:]
        return selective_log_softmax(logits, input_ids[:, -logits_to_keep:])

    def _loss_from_logps(self, per_token_logps, old_per_token_logps, ref_per_token_logps, advantages, completion_mask):
        coef_1 = torch.exp(per_token_logps - old_per_token_logps)
        coef_2 = torch.clamp(coef_1, 1 - self.args.epsilon, 1 + self.args.epsilon)
        adv = advantages.unsqueeze(1)
        per_token_pg = -torch.min(coef_1 * adv, coef_2 * adv)
        pg_loss = ((per_token_pg * completion_mask).sum(dim=1) / self.args.max_completion_length).mean()

        lengths = completion_mask.sum(dim=1).long().tolist()
        per_sample_kl = []
        for i, n in enumerate(lengths):
            # error: KL001
            seq_kl = per_token_logps[i, :n].sum() - ref_per_token_logps[i, :n].sum()
            per_sample_kl.append(seq_kl)
        kl_loss = sum(per_sample_kl) / len(per_sample_kl)

        self._metrics["kl"].append(statistics.mean(k.item() for k in per_sample_kl))
        self._metrics["pg_loss"].append(pg_loss.item())
        return pg_loss + self.beta * kl_loss

    def compute_loss(self, model, inputs):
        prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        logits_to_keep = completion_ids.size(1)
        per_token_logps = self._get_per_token_logps(model, input_ids, attention_mask, logits_to_keep)
        return self._loss_from_logps(
            per_token_logps,
            inputs["old_per_token_logps"],
            inputs["ref_per_token_logps"],
            inputs["advantages"],
            inputs["completion_mask"],
        )
