# Reviewer: AReaL-style PPO actor. make_stat_fns(ref, mask) is a factory that
# returns a table of closures ({"kl": seq_kl, "response_len": ...}); the actor
# evaluates the whole table in one dict(zip(..., map(...))) pass and reuses the
# "kl" entry both for the logs and for the loss. seq_kl is the right estimator
# (k2 of the sequence log-ratio), but the map feeds every closure
# logprobs.detach() (the table was meant for statistics), so the kl that is added
# to the loss is built only from detached log-probs: its gradient is exactly zero.
# Verdict: bug, KL005, reported on the dict(zip(..., map(...))) line that calls the
# closures from the loss.
import torch

from areal.api.cli_args import PPOActorConfig
from areal.utils import stats_tracker


def make_stat_fns(ref_logprobs, loss_mask):
    def seq_kl(logprobs):
        seq_log_ratio = ((logprobs - ref_logprobs) * loss_mask).sum(-1)
        return 0.5 * seq_log_ratio.square()

    def response_len(logprobs):
        return loss_mask.sum(-1).to(logprobs.dtype)

    return {"kl": seq_kl, "response_len": response_len}


def ppo_surrogate(logprobs, old_logprobs, advantages, loss_mask, eps_clip):
    ratio = torch.exp(logprobs - old_logprobs)
    clipped = torch.clamp(ratio, 1.0 - eps_clip, 1.0 + eps_clip)
    pg = -torch.min(ratio * advantages, clipped * advantages)
    return (pg * loss_mask).sum(-1).mean()


class FunctionalPPOActor:
    def __init__(self, config: PPOActorConfig = None, engine=None):
        self.engine = engine
        self.eps_clip = getattr(config, "eps_clip", 0.2)
        self.kl_ctl = getattr(config, "kl_ctl", 0.1)
        self.last_stats = {}

    def loss_fn(self, logprobs, old_logprobs, ref_logprobs, advantages, loss_mask):
        pg_loss = ppo_surrogate(logprobs, old_logprobs, advantages, loss_mask, self.eps_clip)
        stat_fns = make_stat_fns(ref_logprobs, loss_mask)
        # error: KL005
        stats = dict(zip(stat_fns, map(lambda fn: fn(logprobs.detach()), stat_fns.values())))
        kl_loss = stats["kl"].mean()
        loss = pg_loss + self.kl_ctl * kl_loss
        self.last_stats = dict(pg_loss=pg_loss.item(), kl=kl_loss.item(), response_len=stats["response_len"].mean().item())
        return loss

    def ppo_update(self, data):
        logits = self.engine.forward(data["input_ids"], attention_mask=data["attention_mask"])
        resp = data["responses"]
        logprobs = torch.log_softmax(logits[:, -resp.shape[-1] - 1 : -1].float(), -1)
        logprobs = logprobs.gather(-1, resp.unsqueeze(-1)).squeeze(-1)
        loss = self.loss_fn(logprobs, data["old_logprobs"], data["ref_logprobs"], data["advantages"], data["loss_mask"])
        self.engine.backward(loss)
        self.engine.step()
        stats_tracker.scalar(**self.last_stats)
