# Reviewer: the base learner. Its compute_loss (own-token KL reward) is
# overridden by RLOOLearner and never runs.
import torch

from oat.learners.base import LearnerBase


class PolicyGradientLearner(LearnerBase):
    def __init__(self, args, policy=None, ref=None):
        self.args = args
        self.policy = policy
        self.ref = ref

    @staticmethod
    def rloo_advantages(scores: torch.Tensor, n: int) -> torch.Tensor:
        grouped = scores.view(-1, n)
        baseline = (grouped.sum(1, keepdim=True) - grouped) / (n - 1)
        return (grouped - baseline).view(-1)

    def compute_loss(self, logps, ref_logps, advantages, mask):
        with torch.no_grad():
            # ok: KL003
            kl_rewards = -self.args.beta * (logps - ref_logps) * mask
            token_adv = advantages.unsqueeze(-1) + kl_rewards
        return -(token_adv * logps * mask).sum(-1).mean()

    def learning_step(self, batch):
        logps = self.policy.logprobs(batch["input_ids"], batch["response_mask"])
        with torch.no_grad():
            ref_logps = self.ref.logprobs(batch["input_ids"], batch["response_mask"])
        adv = self.rloo_advantages(batch["scores"], self.args.num_samples)
        loss = self.compute_loss(logps, ref_logps, adv, batch["response_mask"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.args.max_grad_norm)
        return {"loss": loss.item()}
