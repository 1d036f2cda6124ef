# Reviewer: oat-style PPO learner that builds per-token rewards in plain Python:
# log-probs leave torch with .tolist(), the KL of each token is written
# ref - old (the NEGATIVE log-ratio), and the reward is -beta * kl. The two
# minus signs cancel: the reward is +beta * (logp - ref), a KL BONUS. Returns
# are a Python reverse loop (gamma = 1) rebuilt with torch.tensor and weight
# logp in the minimised loss, whose KL gradient is therefore
# -beta * grad KL(pi||pi_ref) of the sequence: the run is pushed away from the
# reference.
# Verdict: bug, KL006, reported inside compute_returns on the estimate line
# (the sign is spread over that line and the reward line).
from dataclasses import dataclass

import torch

from oat.learners.rl import RLLearner
from oat.utils.ops import masked_mean


@dataclass
class PPOArgs:
    beta: float = 0.05
    gamma: float = 1.0
    eps_clip: float = 0.2


class TokenRewardPPO:
    def __init__(self, args: PPOArgs = PPOArgs()):
        self.args = args
        self.beta = args.beta
        self.gamma = args.gamma

    @torch.no_grad()
    def compute_returns(self, old_logps, ref_logps, masks, scores):
        T = old_logps.shape[1]
        all_returns = []
        for b in range(old_logps.shape[0]):
            n = int(masks[b].sum().item())
            old = old_logps[b, :n].tolist()
            ref = ref_logps[b, :n].tolist()
            # error: KL006
            kl = [r - o for r, o in zip(ref, old)]
            rewards = [-self.beta * k for k in kl]
            rewards[-1] += float(scores[b])
            returns, running = [0.0] * n, 0.0
            for t in reversed(range(n)):
                running = rewards[t] + self.gamma * running
                returns[t] = running
            all_returns.append(returns + [0.0] * (T - n))
        return torch.tensor(all_returns, dtype=old_logps.dtype, device=old_logps.device)

    def policy_loss(self, logps, old_logps, returns, masks):
        ratio = torch.exp(logps - old_logps)
        clipped = ratio.clamp(1 - self.args.eps_clip, 1 + self.args.eps_clip)
        pg = -torch.min(ratio * returns, clipped * returns)
        return (pg * masks).sum(-1).mean()

    def learning_step(self, model, batch):
        returns = self.compute_returns(batch["old_logps"], batch["ref_logps"], batch["masks"], batch["scores"])
        logps = model.compute_logps(batch["input_ids"], batch["attention_mask"])
        loss = self.policy_loss(logps, batch["old_logps"], returns, batch["masks"])
        loss.backward()
        return {"loss": loss.item(), "return": masked_mean(returns, batch["masks"]).item()}
