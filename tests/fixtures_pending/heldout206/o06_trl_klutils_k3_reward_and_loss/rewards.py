"""Sequence rewards and advantages, computed once per generation batch."""
import torch

from .kl_utils import KLUtils


class RewardProcessor:
    def __init__(self, args):
        self.args = args
        self.reward_baseline = 0.0  # running mean of the rewards, updated after each batch

    @torch.no_grad()
    def compute_advantages(self, scores, old_per_token_logps, ref_per_token_logps, completion_mask):
        """REINFORCE advantages against a running baseline; one value per completion.

        The sequence k3 is charged in the reward with the same beta as the k3
        loss in trainer.py: the two halves together have the gradient of
        KL(pi||pi_ref) (reward: sg(k3) * grad logp; loss: grad k3).
        """
        # ok: KL004
        seq_k3 = KLUtils.masked_sequence_sum(KLUtils.k3(old_per_token_logps, ref_per_token_logps), completion_mask)
        rewards = scores - self.args.beta * seq_k3
        advantages = rewards - self.reward_baseline
        stats = {"reward": rewards.mean().item(), "kl_k3": seq_k3.mean().item()}
        self.reward_baseline = 0.9 * self.reward_baseline + 0.1 * rewards.mean().item()
        return advantages, stats
