# Reviewer: SkyRL-style trainer that keeps `[policy, anchor]` in a list and
# scores a batch with both in `_score_models`. That method is decorated with
# @torch.no_grad() (meant for the anchor), so the policy's log-probs `a` that
# it returns carry no gradient either. The KL loss, k2 of the SEQUENCE
# log-ratio (the right estimator), is built from `a` and `b` and added to the
# loss: it has no gradient path to the policy, and the regulariser does
# nothing. The policy-gradient term uses a separate fresh forward.
# Verdict: bug, KL005, reported on the `seq_kl = ...` line.
import torch

from skyrl_train.training_batch import TrainingInputBatch
from skyrl_train.utils.ppo_utils import compute_approx_kl


class ListAnchoredTrainer:
    def __init__(self, policy, anchor, kl_coef=0.02, eps_clip=0.2):
        anchor.eval()
        for p in anchor.parameters():
            p.requires_grad_(False)
        self.models = [policy, anchor]
        self.kl_coef = kl_coef
        self.eps_clip = eps_clip

    @staticmethod
    def _logprobs(model, sequences, num_actions):
        logits = model(input_ids=sequences).logits[:, -num_actions - 1 : -1]
        return torch.gather(logits.log_softmax(-1), 2, sequences[:, -num_actions:].unsqueeze(-1)).squeeze(-1)

    @torch.no_grad()
    def _score_models(self, sequences, num_actions):
        return [self._logprobs(m, sequences, num_actions) for m in self.models]

    def training_step(self, batch: dict):
        sequences, loss_mask = batch["sequences"], batch["loss_mask"].to(torch.float64)
        num_actions = loss_mask.size(1)
        a, b = self._score_models(sequences, num_actions)

        action_log_probs = self._logprobs(self.models[0], sequences, num_actions)
        ratio = torch.exp(action_log_probs - batch["old_action_log_probs"])
        adv = batch["advantages"].unsqueeze(-1)
        surr = torch.min(ratio * adv, ratio.clamp(1 - self.eps_clip, 1 + self.eps_clip) * adv)
        policy_loss = (-surr * loss_mask).sum(-1).mean()

        # error: KL005
        seq_kl = 0.5 * ((a - b) * loss_mask).sum(-1).pow(2)
        kl_loss = seq_kl.mean()
        loss = policy_loss + self.kl_coef * kl_loss
        return loss, {"policy_loss": policy_loss.item(), "kl_loss": kl_loss.item()}
