# Reviewer: an unsloth-style patched GRPO loss with a "sequence-level KL". The
# masked log-ratio is reverse-accumulated with torch.cumsum(x.flip(-1), -1).flip(-1)
# and column 0 of the reward-to-go (the whole response's log-ratio,
# L = sum_t logr_t) is taken. The estimator applied to it is k3,
# exp(-L) + L - 1, with gradient, as a loss: the expected gradient is
# grad KL(pi_ref||pi) of the sequence, the divergence with its arguments swapped.
# Verdict: bug, KL002, reported on the line that computes the sequence k3.
import torch

from unsloth import FastLanguageModel
from unsloth.models.rl import PatchFastRL


def selective_log_softmax(logits, index):
    logps = logits.float().log_softmax(-1)
    return torch.gather(logps, -1, index.unsqueeze(-1)).squeeze(-1)


def grpo_compute_loss(
    old_logps,
    new_logps,
    ref_logps,
    mask,
    advantages,
    beta=0.04,
    epsilon_low=0.2,
    epsilon_high=0.2,
    max_completion_length=512,
):
    coef_1 = torch.exp(new_logps - old_logps)
    coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
    loss_1 = coef_1 * advantages.unsqueeze(1)
    loss_2 = coef_2 * advantages.unsqueeze(1)
    pg_loss = -(torch.min(loss_1, loss_2) * mask).sum(-1).mean() / max_completion_length

    # ok: KL001
    log_ratio = (new_logps - ref_logps) * mask
    kl_to_go = torch.cumsum(log_ratio.flip(-1), dim=-1).flip(-1)
    seq_log_ratio = kl_to_go[:, 0]
    # error: KL002
    seq_kl = torch.exp(-seq_log_ratio) + seq_log_ratio - 1
    kl_loss = seq_kl.mean()

    loss = pg_loss + beta * kl_loss
    with torch.no_grad():
        completion_length = mask.sum(-1).float().mean()
        mean_kl = seq_kl.mean()
    return loss, completion_length, mean_kl


class UnslothSeqKLGRPOTrainer:
    def __init__(self, model, ref_model, args):
        self.model = model
        self.ref_model = ref_model
        self.args = args

    def _logps(self, model, input_ids, attention_mask, logits_to_keep):
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        logits = logits[:, -logits_to_keep - 1 : -1]
        return selective_log_softmax(logits, input_ids[:, -logits_to_keep:])

    def compute_loss(self, model, inputs):
        input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        keep = inputs["completion_ids"].size(1)
        new_logps = self._logps(model, input_ids, attention_mask, keep)
        loss, completion_length, mean_kl = grpo_compute_loss(
            inputs["old_per_token_logps"],
            new_logps,
            inputs["ref_per_token_logps"],
            inputs["completion_mask"],
            inputs["advantages"],
            beta=self.args.beta,
            max_completion_length=self.args.max_completion_length,
        )
        self.log({"completion_length": completion_length.item(), "kl": mean_kl.item()})
        return loss

    def log(self, logs):
        print(logs)
