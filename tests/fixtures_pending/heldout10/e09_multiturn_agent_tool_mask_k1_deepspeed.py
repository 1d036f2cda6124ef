"""Multi-turn agent trainer (SkyRL / verl-agent flavour) with tool-output tokens masked
out of the loss.  The KL term, despite its name `low_var_kl`, is the plain log-ratio
logp - ref on the assistant tokens, differentiated as a loss: its gradient is grad logp,
whose expectation given each prefix is zero, so the term regularises nothing (KL001).
The tool tokens come from the environment, not the policy, and the mask keeps them out.
"""
import os

import torch

KL_COEF = float(os.environ.get("AGENT_KL_COEF", "0.02"))


def build_loss_mask(turn_roles, response_len):
    """1 on tokens the policy generated, 0 on tool / observation tokens."""
    mask = torch.zeros(len(turn_roles), response_len)
    for b, roles in enumerate(turn_roles):
        for t, role in enumerate(roles[:response_len]):
            mask[b, t] = 1.0 if role == "assistant" else 0.0
    return mask


def gather_logprobs(logits, ids):
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)


def agent_loss(logprobs, old_logprobs, ref_logprobs, advantages, loss_mask, clip=0.2, kl_coef=KL_COEF):
    ratio = (logprobs - old_logprobs).exp()
    clipped = ratio.clamp(1.0 - clip, 1.0 + clip)
    pg = -torch.minimum(ratio * advantages, clipped * advantages)
    n_tok = loss_mask.sum().clamp(min=1.0)
    pg_loss = (pg * loss_mask).sum() / n_tok
    # error: KL001
    low_var_kl = (logprobs - ref_logprobs) * loss_mask
    kl_loss = low_var_kl.sum() / n_tok
    return pg_loss + kl_coef * kl_loss, {"kl": kl_loss.item()}


def train_on_trajectories(engine, ref_model, trajectories):
    ids = trajectories["input_ids"]
    loss_mask = build_loss_mask(trajectories["roles"], ids.shape[1])
    logprobs = gather_logprobs(engine(ids).logits, ids)
    with torch.no_grad():
        ref_logprobs = gather_logprobs(ref_model(ids).logits, ids)
    loss, metrics = agent_loss(logprobs, trajectories["old_logprobs"], ref_logprobs, trajectories["advantages"], loss_mask)
    engine.backward(loss)
    engine.step()
    return metrics
