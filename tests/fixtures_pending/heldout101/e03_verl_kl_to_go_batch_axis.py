# Reviewer: verl-style actor micro-batch loss after the KL fix. The team
# replaced the low_var_kl loss by the score-function form with a reward-to-go,
# kl_to_go * log_prob, and added a small `reverse_cumsum` utility. The utility
# defaults to dim=0 and the call does not pass the time axis, so the "reward-to-go"
# runs over the rows of the micro-batch (sequence b gets the log-ratios of rows
# b..B-1 at the same position t), not over the later tokens of its own response.
# The other rows are independent samples, so in expectation each token is weighted
# by its own log-ratio only: the token-level partial gradient of the sequence
# KL(pi||pi_ref).
# Verdict: BUG (KL003), reported on the line that multiplies the detached weight by
# the log-probs (the KL term).
import torch
from verl import DataProto
from verl.utils.torch_functional import masked_mean


def reverse_cumsum(x: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """sum_{s >= i} x_s along `dim`."""
    return torch.flip(torch.cumsum(torch.flip(x, dims=[dim]), dim=dim), dims=[dim])


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str = "seq-mean-token-sum"):
    if loss_agg_mode == "token-mean":
        return masked_mean(loss_mat, loss_mask)
    if loss_agg_mode == "seq-mean-token-sum":
        return (loss_mat * loss_mask).sum(dim=-1).mean()
    raise ValueError(f"invalid loss_agg_mode: {loss_agg_mode}")


class KLToGoActor:
    def __init__(self, config, actor_module, actor_optimizer):
        self.config = config
        self.actor_module = actor_module
        self.actor_optimizer = actor_optimizer

    def micro_batch_loss(self, log_prob, old_log_prob, ref_log_prob, advantages, response_mask):
        clip = self.config.clip_ratio
        negative_approx_kl = log_prob - old_log_prob
        ratio = torch.exp(negative_approx_kl)
        pg_losses = torch.maximum(-advantages * ratio, -advantages * torch.clamp(ratio, 1 - clip, 1 + clip))
        pg_loss = agg_loss(pg_losses, response_mask, self.config.loss_agg_mode)

        with torch.no_grad():
            log_ratio = (log_prob - ref_log_prob) * response_mask
            kl_to_go = reverse_cumsum(log_ratio)
        # score-function KL with reward-to-go (fix for the low_var_kl direction bug)
        # error: KL003
        kl_loss = agg_loss(kl_to_go * log_prob, response_mask, self.config.loss_agg_mode)
        policy_loss = pg_loss + self.config.kl_loss_coef * kl_loss
        metrics = {
            "actor/pg_loss": pg_loss.detach().item(),
            "actor/kl": masked_mean(log_ratio, response_mask).item(),
            "actor/ppo_kl": masked_mean(-negative_approx_kl, response_mask).detach().item(),
        }
        return policy_loss, metrics

    def update_policy(self, data: DataProto):
        self.actor_module.train()
        metrics = {}
        for mini_batch in data.split(self.config.ppo_mini_batch_size):
            self.actor_optimizer.zero_grad()
            micro_batches = mini_batch.split(self.config.ppo_micro_batch_size_per_gpu)
            for mb in micro_batches:
                mb = mb.batch
                logits = self.actor_module(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"]).logits
                resp_len = mb["responses"].size(-1)
                logits = logits[:, -resp_len - 1 : -1, :]
                log_prob = logits.log_softmax(-1).gather(-1, mb["responses"].unsqueeze(-1)).squeeze(-1)
                loss, metrics = self.micro_batch_loss(log_prob, mb["old_log_probs"], mb["ref_log_prob"],
                                                      mb["advantages"], mb["response_mask"])
                (loss / len(micro_batches)).backward()
            self.actor_optimizer.step()
        return metrics
