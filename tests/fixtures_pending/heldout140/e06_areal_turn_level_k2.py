# Reviewer: AReaL-style multi-turn PPO actor with a "turn-level" KL loss. The
# masked log-ratio of each assistant turn is summed (scatter_add by turn id, the
# turn ids coming from the multi-turn rollout's `turn_ids` field; observation
# tokens are masked out), then k2 of each TURN log-ratio, 0.5 * L_k**2, is
# summed over turns. Each turn's score is weighted by its own turn's log-ratio
# only: the KL of later turns, which an earlier turn steers, is never credited
# to it. The expected gradient is a partial gradient of the trajectory KL (the
# turn-level analogue of summing per-token k2), not grad KL(pi||pi_ref).
# Verdict: bug, KL003, reported where the per-turn k2 is computed.
from dataclasses import dataclass

import torch

from areal.api.cli_args import PPOActorConfig
from areal.utils.data import split_padded_tensor_dict_into_mb_list


@dataclass
class TurnKLConfig:
    eps_clip: float = 0.2
    kl_ctl: float = 0.1
    max_turns: int = 8


def turn_log_ratio(logprobs, ref_logprobs, loss_mask, turn_ids, max_turns):
    log_ratio = (logprobs - ref_logprobs) * loss_mask
    out = torch.zeros(logprobs.shape[0], max_turns, dtype=log_ratio.dtype, device=log_ratio.device)
    return out.scatter_add(1, turn_ids.clamp(min=0), log_ratio)


class MultiTurnPPOActor:
    def __init__(self, engine, config: TurnKLConfig = TurnKLConfig()):
        self.engine = engine
        self.config = config

    def ppo_loss(self, logprobs, old_logprobs, ref_logprobs, advantages, loss_mask, turn_ids):
        cfg = self.config
        ratio = torch.exp(logprobs - old_logprobs)
        pg = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - cfg.eps_clip, 1 + cfg.eps_clip))
        pg_loss = (pg * loss_mask).sum() / loss_mask.sum()
        per_turn = turn_log_ratio(logprobs, ref_logprobs, loss_mask, turn_ids, cfg.max_turns)
        # error: KL003
        turn_kl = 0.5 * per_turn.pow(2)
        kl_loss = turn_kl.sum(-1).mean()
        stats = {"pg_loss": pg_loss.detach(), "turn_kl": turn_kl.detach().sum(-1).mean()}
        return pg_loss + cfg.kl_ctl * kl_loss, stats

    def ppo_update(self, data):
        all_stats = []
        for mb in split_padded_tensor_dict_into_mb_list(data, 4).mbs:
            logits = self.engine.forward(mb["input_ids"], mb["attention_mask"])
            logprobs = torch.log_softmax(logits[:, :-1], -1).gather(-1, mb["input_ids"][:, 1:, None])[..., 0]
            loss, stats = self.ppo_loss(
                logprobs, mb["logprobs"], mb["ref_logp"], mb["advantages"], mb["loss_mask"], mb["turn_ids"]
            )
            self.engine.backward(loss)
            all_stats.append(stats)
        self.engine.step()
        return all_stats
