"""Loss for packed multi-turn trajectories: REINFORCE on assistant tokens + KL."""

import torch

from .kl_terms import turn_kl
from .packing import assistant_token_mask, per_segment_sum, segment_ids_from_position_ids


class AgentTurnLoss:
    def __init__(self, kl_coef: float = 0.02):
        self.kl_coef = kl_coef

    def __call__(self, logprobs, old_ckpt_logprobs, position_ids, role_ids, traj_advantages):
        # logprobs / old_ckpt_logprobs / role_ids: [N] (one packed row, flattened)
        seg = segment_ids_from_position_ids(position_ids)
        n_traj = int(seg.max().item()) + 1
        mask = assistant_token_mask(role_ids)

        token_adv = traj_advantages[seg]
        pg = -per_segment_sum(token_adv * logprobs * mask, seg, n_traj)

        # error: KL002
        kl = turn_kl(logprobs, old_ckpt_logprobs)
        kl_per_traj = per_segment_sum(kl * mask, seg, n_traj)

        loss = (pg + self.kl_coef * kl_per_traj).mean()
        return loss, {"kl": kl_per_traj.mean().item()}


def train_step(model, batch, optimizer, loss_fn: AgentTurnLoss):
    logprobs = model.packed_logprobs(batch["input_ids"], batch["position_ids"]).view(-1)
    loss, stats = loss_fn(logprobs, batch["old_ckpt_logprobs"].view(-1), batch["position_ids"], batch["role_ids"].view(-1), batch["advantages"])
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return stats
