# Reviewer: ROLL-style actor worker whose KL-to-go helper was ported from a
# Megatron (sequence-first) code path. Here the tensors are batch-major [B, T],
# but the flips and the cumsum still run along dims=[0]: the "KL-to-go" of
# token (b, t) is sum_{b'>=b} logr_{b',t}, an accumulation over the other
# responses at the SAME position, never over later tokens of the same response.
# Cross-sample terms vanish in expectation (independent samples, zero-mean
# score), so the score-function term has the expected gradient of the per-token
# sg(logr_t) * logp_t: the token-level partial gradient of KL(pi||pi_ref).
# Verdict: bug, KL003, reported on the line that multiplies the detached
# weight by the log-probs (the KL penalty term).
import torch

from roll.distributed.scheduler.protocol import DataProto
from roll.pipeline.base_worker import ActorWorker
from roll.utils.functionals import masked_mean


class KLToGoActorWorker(ActorWorker):
    def __init__(self, worker_config):
        super().__init__(worker_config)
        self.pg_clip = worker_config.pg_clip
        self.kl_loss_coef = worker_config.kl_loss_coef

    def kl_to_go(self, log_ratio):
        """Reverse cumulative sum of the per-token log-ratio (ported helper)."""
        return torch.flip(torch.cumsum(torch.flip(log_ratio, dims=[0]), dim=0), dims=[0])

    def loss_func(self, data: DataProto, output_tensor: torch.Tensor):
        response_mask = data.batch["response_mask"][:, 1:].float()
        ref_log_probs = data.batch["ref_log_probs"]
        old_log_probs = data.batch["old_log_probs"]
        advantages = data.batch["advantages"]
        log_probs = self.strategy.op_compute_log_probs(
            logits=output_tensor, input_ids=data.batch["input_ids"], attention_mask=data.batch["response_mask"]
        )
        return self.compute_losses(log_probs, old_log_probs, ref_log_probs, advantages, response_mask)

    def compute_losses(self, log_probs, old_log_probs, ref_log_probs, advantages, response_mask):
        ratio = (log_probs - old_log_probs).exp()
        surr1 = ratio * advantages
        surr2 = ratio.clamp(1 - self.pg_clip, 1 + self.pg_clip) * advantages
        pg_loss = (-torch.min(surr1, surr2) * response_mask).sum(-1).mean()

        log_ratio = (log_probs - ref_log_probs).detach() * response_mask  # [B, T]
        kl_weight = self.kl_to_go(log_ratio)
        # error: KL003
        kl_penalty = (kl_weight * log_probs * response_mask).sum(-1)
        kl_loss = kl_penalty.mean()

        total_loss = pg_loss + self.kl_loss_coef * kl_loss
        metrics = {
            "actor/pg_loss": pg_loss.detach().item(),
            "actor/kl_loss": kl_loss.detach().item(),
            "actor/approx_kl": masked_mean(log_ratio, response_mask).item(),
        }
        return total_loss, metrics
