"""oat-style PPO learner with a KL loss written as a reward-to-go score function.

The logged value is the k1 estimate; the gradient is that of the sequence
KL(pi || pi_ref): each token's log-prob is weighted by the log-ratio summed
over that token and all later ones (computed without gradient).
"""

from dataclasses import dataclass
from typing import Dict

import torch


@dataclass
class PPOArgs:
    beta: float = 0.05
    kl_estimator: str = "k1_rtg"
    clip_range_low: float = 0.2
    clip_range_high: float = 0.2
    train_batch_size_per_device: int = 8


def kl_reward_to_go(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        to_go = torch.zeros_like(log_ratio)
        running = torch.zeros_like(log_ratio[:, 0])
        for t in reversed(range(log_ratio.size(1))):
            running = running + log_ratio[:, t] * mask[:, t]
            to_go[:, t] = running
    return to_go


def policy_kl_loss(args: PPOArgs, logps: torch.Tensor, ref_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    log_ratio = (logps - ref_logps) * mask
    if args.kl_estimator == "k2_seq":
        # ok: KL003
        return (0.5 * log_ratio.sum(-1) ** 2).mean()
    kl_to_go = kl_reward_to_go(log_ratio, mask)
    # ok: KL001, KL003, KL005
    kl_term = log_ratio.detach() + kl_to_go * (logps - logps.detach())
    return (kl_term * mask).sum(-1).mean()


class PPOLearner:
    def __init__(self, model, strategy, optimizer, args: PPOArgs = PPOArgs()):
        self.model = model
        self.strategy = strategy
        self.optimizer = optimizer
        self.args = args

    def compute_logps(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_len: int) -> torch.Tensor:
        logits = self.model(input_ids, attention_mask=attention_mask).logits[:, -response_len - 1 : -1].float()
        return torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, -response_len:].unsqueeze(-1)).squeeze(-1)

    def learning_step(self, trajectory: Dict[str, torch.Tensor]) -> Dict[str, float]:
        mask = trajectory["response_masks"].float()
        logps = self.compute_logps(trajectory["input_ids"], trajectory["att_mask"], mask.size(1))
        ratio = torch.exp(logps - trajectory["action_logprobs"])
        adv = trajectory["advantages"]
        pg_loss = torch.max(
            -adv * ratio, -adv * ratio.clamp(1 - self.args.clip_range_low, 1 + self.args.clip_range_high)
        )
        pg_loss = (pg_loss * mask).sum(-1).mean()
        kl_loss = policy_kl_loss(self.args, logps, trajectory["ref_logprobs"], mask)
        loss = pg_loss + self.args.beta * kl_loss
        self.strategy.backward(loss, self.model, self.optimizer)
        self.strategy.optimizer_step(self.optimizer, self.model)
        return {"pg_loss": pg_loss.item(), "kl": kl_loss.item()}
