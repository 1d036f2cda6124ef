# Reviewer: the learner switched its optimizer to `maximize=True` and now backpropagates
# an objective instead of a loss. The policy-gradient part was rewritten as a reward to
# maximise, but the sequence KL is still *added* as if it were a loss term: under gradient
# ascent that maximises KL(pi||pi_ref).
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from oat.learners.base import LearnerBase


@dataclass
class AscentArgs:
    learning_rate: float = 1e-6
    beta: float = 0.05
    max_norm: float = 1.0
    micro_batch_size: int = 4


class AscentPGLearner(LearnerBase):
    def __init__(self, actor, ref_model, args: AscentArgs):
        self.actor = actor
        self.ref_model = ref_model
        self.args = args
        # we write objectives, not losses: let the optimizer climb
        self.optimizer = torch.optim.AdamW(actor.parameters(), lr=args.learning_rate, maximize=True)

    def _token_logps(self, model, input_ids, attention_mask, response_mask):
        logits = model(input_ids, attention_mask=attention_mask).logits[:, :-1].float()
        labels = input_ids[:, 1:]
        logps = torch.gather(F.log_softmax(logits, dim=-1), 2, labels.unsqueeze(-1)).squeeze(-1)
        return logps * response_mask[:, 1:]

    def pg_kl_objective(self, logps, ref_logps, mask, advantages):
        seq_logps = (logps * mask).sum(-1)
        pg_objective = (advantages * seq_logps).mean()
        # error: KL006
        kl_loss = 0.5 * (((logps - ref_logps) * mask).sum(-1) ** 2).mean()
        objective = pg_objective + self.args.beta * kl_loss
        return objective, {"kl_k2": kl_loss.detach()}

    def learning_step(self, batch):
        input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
        response_mask = batch["response_mask"]
        logps = self._token_logps(self.actor, input_ids, attention_mask, response_mask)
        with torch.no_grad():
            ref_logps = self._token_logps(self.ref_model, input_ids, attention_mask, response_mask)
        advantages = batch["rewards"] - batch["rewards"].mean()

        objective, infos = self.pg_kl_objective(logps, ref_logps, response_mask[:, 1:], advantages)
        self.optimizer.zero_grad()
        objective.backward()
        torch.nn.utils.clip_grad_norm_(self.actor.parameters(), self.args.max_norm)
        self.optimizer.step()
        infos["objective"] = objective.detach()
        return infos
