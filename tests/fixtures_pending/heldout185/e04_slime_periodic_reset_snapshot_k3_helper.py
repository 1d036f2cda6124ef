# Reviewer: slime-style trainer with a "moving anchor": self.snapshot is a
# frozen deepcopy of the policy that is overwritten with the policy's weights
# every `snapshot_interval` rollouts (`snapshot.load_state_dict(policy.state_dict())`);
# between resets it is a fixed reference. policy_loss forms the ratio
# exp(snapshot_lp - log_probs) and hands it to _snapshot_penalty, a loss helper
# of this file called from one place with no parameter that steers it. That
# helper writes k3 (`ratio - ratio.log() - 1`) and reduces it over tokens: a k3
# loss with the policy's gradient, i.e. the token-level grad of KL(pi_ref||pi).
# Verdict: bug, KL002, reported inside _snapshot_penalty on its k3 line.
import copy
from argparse import Namespace

import torch
from slime.utils.ppo_utils import compute_policy_loss
from slime.backends.megatron_utils import get_batch


class SnapshotAnchoredTrainer:
    def __init__(self, args: Namespace, policy):
        self.args = args
        self.policy = policy
        self.snapshot = copy.deepcopy(policy).requires_grad_(False)
        self.snapshot_interval = getattr(args, "snapshot_interval", 8)

    @torch.no_grad()
    def maybe_reset_snapshot(self, rollout_id):
        if rollout_id > 0 and rollout_id % self.snapshot_interval == 0:
            self.snapshot.load_state_dict(self.policy.state_dict())

    def _token_log_probs(self, model, tokens, response_length):
        logits = model(input_ids=tokens, attention_mask=torch.ones_like(tokens)).logits
        logits = logits[:, -response_length - 1 : -1]
        return logits.log_softmax(-1).gather(-1, tokens[:, -response_length:, None]).squeeze(-1)

    def _snapshot_penalty(self, ratio, loss_mask):
        # error: KL002
        per_token = ratio - ratio.log() - 1
        return (per_token * loss_mask).sum(-1).mean()

    def policy_loss(self, batch):
        args = self.args
        loss_mask = batch["loss_masks"]
        tokens = batch["tokens"]
        n = loss_mask.size(1)
        log_probs = self._token_log_probs(self.policy, tokens, n)
        with torch.no_grad():
            snapshot_lp = self._token_log_probs(self.snapshot, tokens, n)

        pg_ratio = torch.exp(log_probs - batch["log_probs"])
        pg_loss = -(pg_ratio * batch["advantages"].unsqueeze(-1) * loss_mask).sum(-1).mean()
        anchor_ratio = torch.exp(snapshot_lp - log_probs)
        kl_loss = self._snapshot_penalty(anchor_ratio, loss_mask)
        loss = pg_loss + args.kl_loss_coef * kl_loss
        return loss, {"pg_loss": pg_loss.detach(), "kl_loss": kl_loss.detach()}

    def train_step(self, rollout_id, batch, optimizer):
        self.maybe_reset_snapshot(rollout_id)
        loss, log = self.policy_loss(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return log
