# Reviewer: learner side. The policy term is recomputed with gradient; the KL
# term is read back from `experience.info["kl"]`, which maker.py produced under
# no_grad, so `self.beta * kl_loss` adds nothing to the gradient.
"""GRPO learner: clipped surrogate plus a KL penalty read from the experience."""

import logging

import torch

from .experience import Experience, split_experience
from .maker import ExperienceMaker, sequence_log_probs

logger = logging.getLogger(__name__)


class GRPOLearner:
    def __init__(self, policy, optimizer, maker: ExperienceMaker, beta: float = 0.04, clip_eps: float = 0.2, micro_batch_size: int = 4):
        self.policy = policy
        self.optimizer = optimizer
        self.maker = maker
        self.beta = beta
        self.clip_eps = clip_eps
        self.micro_batch_size = micro_batch_size

    def learning_step(self, experience: Experience) -> dict:
        log_probs = sequence_log_probs(self.policy, experience.sequences, experience.attention_mask, experience.num_actions)
        ratio = torch.exp(log_probs - experience.action_log_probs)
        clipped = torch.clamp(ratio, 1 - self.clip_eps, 1 + self.clip_eps)
        surrogate = torch.min(ratio * experience.advantages, clipped * experience.advantages)
        pg_loss = -(surrogate * experience.action_mask).sum(dim=-1).mean()

        kl_loss = experience.info["kl"].mean()
        loss = pg_loss + self.beta * kl_loss
        loss.backward()
        return {"pg_loss": pg_loss.item(), "kl": kl_loss.item(), "score": experience.info["score"].mean().item()}

    def step(self, sequences, attention_mask, action_mask) -> dict:
        experience = self.maker.make_experience(sequences, attention_mask, action_mask)
        self.optimizer.zero_grad()
        stats = []
        for micro in split_experience(experience, self.micro_batch_size):
            stats.append(self.learning_step(micro))
        grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), 1.0)
        self.optimizer.step()
        out = {k: sum(s[k] for s in stats) / len(stats) for k in stats[0]}
        out["grad_norm"] = float(grad_norm)
        logger.info("grpo step: %s", out)
        return out
