# Reviewer: the RLOO learner; compute_loss here overrides the base class's.
import torch

from .pg_learner import PolicyGradientLearner


class RLOOLearner(PolicyGradientLearner):
    """RLOO with the reference KL folded into the token advantages."""

    def compute_loss(self, logps, ref_logps, advantages, mask):
        with torch.no_grad():
            # ok: KL003
            kl_rewards = -self.args.beta * (logps - ref_logps) * mask
            kl_returns = kl_rewards.flip(-1).cumsum(-1).flip(-1)
            token_adv = advantages.unsqueeze(-1) + kl_returns
            self.kl_stat = (-kl_rewards.sum(-1) / self.args.beta).mean().item()
        pg_loss = -(token_adv * logps * mask).sum(-1)
        return pg_loss.mean()

    def learning_step(self, batch):
        stats = super().learning_step(batch)
        stats["kl"] = self.kl_stat
        stats["algo"] = "rloo"
        return stats

    def eval_step(self, batch):
        with torch.no_grad():
            logps = self.policy.logprobs(batch["input_ids"], batch["response_mask"])
            return {"eval/logp": (logps * batch["response_mask"]).sum(-1).mean().item()}
