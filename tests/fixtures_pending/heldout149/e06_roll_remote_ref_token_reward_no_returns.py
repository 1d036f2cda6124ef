# Reviewer: ROLL-style actor worker. The reference is served by a separate
# process (a Ray actor cluster, `self.peer`); its log-probs come back as plain
# tensors, and the policy's rollout log-probs `old_log_probs` are a no_grad
# behaviour snapshot. `shape_advantages` (no_grad) puts a per-token KL reward
# `-kl_coef * (old - peer)` in each token's advantage and adds the
# sequence-level score, with NO reward-to-go: each KL reward weights only its
# own token's log-prob in the PPO loss. The expected gradient is the
# token-level partial of grad KL(pi||pi_ref).
# Verdict: bug, KL003, reported where the KL reward is computed
# (`token_rewards = ...` in `shape_advantages`).
import torch

import ray
from roll.distributed.scheduler.protocol import DataProto
from roll.pipeline.base_worker import ActorWorker


class ShapedActorWorker:
    def __init__(self, peer_cluster=None, kl_coef=0.05, clip=0.2):
        self.peer = peer_cluster
        self.kl_coef = kl_coef
        self.clip = clip

    def fetch_peer_log_probs(self, data: DataProto):
        refs = self.peer.compute_log_probs(data, blocking=False)
        return ray.get(refs).batch["log_probs"]

    @torch.no_grad()
    def shape_advantages(self, old_log_probs, peer_log_probs, scores, response_mask):
        # error: KL003
        token_rewards = -self.kl_coef * (old_log_probs - peer_log_probs) * response_mask
        advantages = token_rewards + scores.unsqueeze(-1) * response_mask
        return advantages

    def loss_func(self, log_probs, old_log_probs, advantages, response_mask):
        ratio = torch.exp(log_probs - old_log_probs)
        surr1 = ratio * advantages
        surr2 = ratio.clamp(1 - self.clip, 1 + self.clip) * advantages
        loss = (-torch.min(surr1, surr2) * response_mask).sum(-1).mean()
        return loss

    def train_step(self, data: DataProto, model, optimizer):
        peer_log_probs = self.fetch_peer_log_probs(data)
        batch = data.batch
        advantages = self.shape_advantages(
            batch["old_log_probs"], peer_log_probs, batch["scores"], batch["response_mask"]
        )
        n = batch["responses"].size(1)
        logits = model(input_ids=batch["input_ids"]).logits[:, -n - 1 : -1]
        log_probs = torch.gather(logits.log_softmax(-1), 2, batch["responses"].unsqueeze(-1)).squeeze(-1)
        loss = self.loss_func(log_probs, batch["old_log_probs"], advantages, batch["response_mask"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return {"actor/loss": loss.item()}
