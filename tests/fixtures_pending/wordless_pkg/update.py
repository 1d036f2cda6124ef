"""Backpropagates ``token_terms.regulariser``: its finding is reported there.

Fixture: parsed by the tests, never executed.
"""

from .token_terms import regulariser


class Learner:
    def __init__(self, model, optimizer, coef=0.01):
        self.model = model
        self.optimizer = optimizer
        self.coef = coef

    def update(self, batch):
        policy_logp = self.model(batch["input_ids"]).log_probs
        mask = batch["mask"]
        surrogate = -(batch["advantages"] * policy_logp * mask).sum() / mask.sum()
        # ok: KL001, KL002, KL003
        total = (
            surrogate
            + self.coef * regulariser(policy_logp, batch["ref_logp"], mask).sum() / mask.sum()
        )
        total.backward()
        self.optimizer.step()
