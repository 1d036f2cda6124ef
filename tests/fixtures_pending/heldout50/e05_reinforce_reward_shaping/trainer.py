# Reviewer: the REINFORCE update: rollout and reference log-probs under
# no_grad, rewards from rewards.shape_rewards, advantages from advantages.py,
# loss -(A_t * logp_t) summed over tokens, mean over sequences, backward.
import logging

import torch

from .advantages import RunningBaseline, compute_returns
from .config import ShapingConfig
from .rewards import shape_rewards

logger = logging.getLogger(__name__)


def gather_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return torch.gather(logp, -1, tokens.unsqueeze(-1)).squeeze(-1)


class ReinforceTrainer:
    def __init__(self, policy, ref_policy, optimizer, cfg: ShapingConfig):
        self.policy = policy
        self.ref_policy = ref_policy
        self.optimizer = optimizer
        self.cfg = cfg
        self.baseline = RunningBaseline(cfg.baseline_momentum)

    def response_logprobs(self, model, batch):
        logits = model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        resp_len = batch["response_ids"].size(1)
        return gather_logprobs(logits[:, -resp_len - 1 : -1], batch["response_ids"], self.cfg.temperature)

    def policy_loss(self, logprobs, advantages, response_mask):
        return -(advantages.detach() * logprobs * response_mask).sum(dim=-1).mean()

    def step(self, batch, scores):
        mask = batch["response_mask"].float()
        with torch.no_grad():
            old_logprobs = self.response_logprobs(self.policy, batch)
            ref_logprobs = self.response_logprobs(self.ref_policy, batch)
            rewards = shape_rewards(scores, old_logprobs, ref_logprobs, mask, self.cfg.kl_coef, self.cfg.score_clip)
            returns = compute_returns(rewards, mask, self.cfg.gamma)
            advantages = self.baseline(returns, mask)

        logprobs = self.response_logprobs(self.policy, batch)
        loss = self.policy_loss(logprobs, advantages, mask)
        self.optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.cfg.max_grad_norm)
        self.optimizer.step()
        self.baseline.update(returns, mask)
        kl = ((old_logprobs - ref_logprobs) * mask).sum(-1).mean().item()
        logger.info("loss=%.4f kl=%.4f return=%.4f", loss.item(), kl, returns[:, 0].mean().item())
        return {"loss": loss.item(), "kl": kl}
