# Reviewer: oat-style REINFORCE learner with a torch.compile'd KL helper that
# works on the *sequence* log-ratio: it sums the masked per-token log-ratio, then
# applies k3, exp(-x) + x - 1, to the sum. Summing first fixes the per-token
# (partial) problem, but k3 differentiated is still the wrong divergence: its
# gradient (1 - exp(-x)) grad log pi(y) has expectation grad KL(pi_ref||pi) of the
# sequence, not grad KL(pi||pi_ref).
# Verdict: BUG (KL002), reported at the call of the helper from the loss (the
# helper is given the log-probs and returns the estimate per sequence).
from dataclasses import dataclass

import torch
from oat.utils.ops import masked_mean


@dataclass
class PGArgs:
    beta: float = 0.02
    critic_type: str = "grpo"
    num_samples: int = 8


@torch.compile(dynamic=True)
def sequence_low_var_kl(logps: torch.Tensor, ref_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """k3 of the whole response's log-ratio, [B, T] -> [B]."""
    seq_log_ratio = ((logps - ref_logps) * mask).sum(-1)
    return torch.exp(-seq_log_ratio) + seq_log_ratio - 1.0


class PolicyGradientLearner:
    def __init__(self, model, optimizer, args: PGArgs):
        self.model, self.optimizer, self.args = model, optimizer, args

    def compute_logps(self, model, input_ids, att_mask, response_mask, temperature=1.0):
        logits = model(input_ids, attention_mask=att_mask)["logits"].float() / temperature
        labels = input_ids[:, 1:].clone()
        logits = logits[:, :-1]
        per_token = torch.gather(logits.log_softmax(-1), 2, labels.unsqueeze(2)).squeeze(2)
        return per_token * response_mask[:, 1:]

    def pg_loss(self, logps, ref_logps, advantages, response_mask):
        seq_logps = (logps * response_mask).sum(-1)
        pg = -(advantages * seq_logps).mean()
        # error: KL002
        seq_kl = sequence_low_var_kl(logps, ref_logps, response_mask)
        kl_loss = seq_kl.mean()
        loss = pg + self.args.beta * kl_loss
        infos = {"kl": seq_kl.detach().mean(), "pg": pg.detach(),
                 "resp_len": masked_mean(response_mask.sum(-1).float(), torch.ones_like(advantages))}
        return loss, infos

    def learning_step(self, trajectory):
        input_ids, att_mask = trajectory["input_ids"], trajectory["attention_mask"]
        response_mask = trajectory["action_mask"][:, 1:].float()
        logps = self.compute_logps(self.model, input_ids, att_mask, trajectory["action_mask"])
        ref_logps = trajectory["ref_logps"]
        rewards = trajectory["rewards"].view(-1, self.args.num_samples)
        advantages = (rewards - rewards.mean(-1, keepdim=True)).view(-1)
        loss, infos = self.pg_loss(logps, ref_logps, advantages, response_mask)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return infos
