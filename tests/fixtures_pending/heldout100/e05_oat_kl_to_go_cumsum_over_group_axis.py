# Reviewer: oat-style learner (a user's PPO/GRPO learner in the oat layout)
# with a score-function KL term and a "KL-to-go" weight. The batch is
# rearranged from [B*G, T] to [B, G, T] for the group baseline, and the
# reward-to-go is then written with flip/cumsum/flip over dims=[1] / dim=1,
# copied from the flat version where dim 1 was time. On [B, G, T], dim 1 is
# the GROUP axis: kl_to_go[b, g, t] = sum_{g'>=g} x[b, g', t], the same
# position of this and the later samples of the prompt, never the later tokens
# of this response. The other samples' terms are independent of the sample and
# vanish in expectation; what is left is x_t * grad logp_t, the token-level
# partial gradient of KL(pi||pi_ref).
# Verdict: bug, KL003, reported on the line that multiplies the detached
# weight by the log-probs (named as the KL term).
import torch
from einops import rearrange
from oat.learners.base import LearnerBase  # noqa: F401


class GroupKLLearnerMixin:
    def group_pg_kl_loss(self, logps, ref_logps, advantages, response_masks):
        args = self.args
        G = args.num_samples
        lp = rearrange(logps, "(b g) t -> b g t", g=G)
        ref_lp = rearrange(ref_logps, "(b g) t -> b g t", g=G)
        mask = rearrange(response_masks, "(b g) t -> b g t", g=G).float()
        adv = rearrange(advantages, "(b g) -> b g 1", g=G)

        pg_loss = -(adv * lp * mask).sum(dim=-1).mean()

        log_ratio = (lp - ref_lp).detach() * mask
        kl_to_go = torch.flip(torch.cumsum(torch.flip(log_ratio, dims=[1]), dim=1), dims=[1])
        # error: KL003
        kl_term = (kl_to_go * lp * mask).sum(dim=-1)
        kl_loss = kl_term.mean()

        loss = pg_loss + args.beta * kl_loss
        infos = {
            "pg_loss": pg_loss.detach(),
            "kl": log_ratio.sum(dim=-1).mean(),
            "kl_to_go_first": kl_to_go[..., 0].mean(),
        }
        return loss, infos

    def learning_step(self, trajectory):
        logps = self.compute_logps(self.model, trajectory["input_ids"], trajectory["att_mask"])
        with torch.no_grad():
            ref_logps = self.compute_logps(self.ref_model, trajectory["input_ids"], trajectory["att_mask"])
        loss, infos = self.group_pg_kl_loss(logps, ref_logps, trajectory["advantages"], trajectory["loss_masks"])
        self.strategy.backward(loss, self.model, self.optimizer)
        self.strategy.optimizer_step(self.optimizer, self.model, self.scheduler)
        return infos
